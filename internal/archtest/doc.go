// Package archtest holds no code, only tests that keep the architecture
// as docs/ARCHITECTURE.md describes it: the dependency rules between
// packages, a doc comment on every package, and the document's package
// table listing exactly the packages that exist.
package archtest
