// Package idgen is corral's one generator of identifiers and secrets: sandbox,
// snapshot, volume and task ids, access tokens, API keys and temporary
// names all come from here, drawn from crypto/rand.
//
// Formats (kept stable: E2B SDKs and clients check their shapes):
//
//   - New(prefix, n): prefix followed by n characters of Alphabet
//     ([a-z0-9]). Sandbox ids are New("", SandboxLen) (20 characters, like
//     E2B's), snapshots New("snap-", 20), volumes New("vol", 17) and tasks
//     New("t", 19) (20 characters in all).
//   - Token(): TokenBytes (24) random bytes in lower-case hex, 48
//     characters: sandbox access tokens and volume tokens.
//   - Hex(n): n random bytes in lower-case hex (2n characters): API keys
//     (e2b_ + Hex(20)), watcher ids, temporary file names.
//
// Each character of New is drawn uniformly (rejection sampling: no
// modulo bias), so an id of n characters carries n·log2(36) ≈ 5.17n
// bits. A failure of the system's random source panics: corral cannot
// make an unguessable credential without it.
package idgen

import (
	"crypto/rand"
	"encoding/hex"
)

// Alphabet is the character set of New's random part.
const Alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

// SandboxLen is the length of a sandbox id (and of the random part of a
// snapshot id).
const SandboxLen = 20

// TokenBytes is how many random bytes a Token carries.
const TokenBytes = 24

// maxUnbiased is the largest multiple of len(Alphabet) that fits in a
// byte: bytes at or above it are redrawn so each character is uniform.
const maxUnbiased = 256 - 256%len(Alphabet)

// New returns prefix followed by n random characters of Alphabet.
func New(prefix string, n int) string {
	out := make([]byte, 0, len(prefix)+n)
	out = append(out, prefix...)
	buf := make([]byte, n+n/4+8)
	for len(out) < len(prefix)+n {
		read(buf)
		for _, b := range buf {
			if int(b) >= maxUnbiased {
				continue
			}
			out = append(out, Alphabet[int(b)%len(Alphabet)])
			if len(out) == len(prefix)+n {
				break
			}
		}
	}
	return string(out)
}

// Token returns a random secret of TokenBytes bytes in hex (48
// characters), for a sandbox's agent or a volume's content API.
func Token() string { return Hex(TokenBytes) }

// Hex returns n random bytes in lower-case hex.
func Hex(n int) string {
	b := make([]byte, n)
	read(b)
	return hex.EncodeToString(b)
}

func read(b []byte) {
	if _, err := rand.Read(b); err != nil {
		panic("idgen: system random source failed: " + err.Error())
	}
}
