package template

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"path/filepath"
	"slices"

	"github.com/corralhq/corral/internal/interpreter"
)

// CodeInterpreterRecipeVersion is the revision of the code-interpreter
// build recipe; bump it when the build changes in a way the package lists,
// files and scripts do not capture.
const CodeInterpreterRecipeVersion = 1

// CodeInterpreterName is the build name of the code-interpreter template
// (the prefix of its build dir and the name in its manifest).
const CodeInterpreterName = interpreter.TemplateName

// CodeInterpreterPackages returns the Debian packages installed (with
// apt-get, without recommended packages) on top of the base template's:
// Jupyter's kernel and client, matplotlib, pandas, numpy, Pillow and a font
// for matplotlib. python3-munkres is listed so that python3-fonttools'
// dependency "python3-scipy | python3-munkres" is met by the small one:
// apt picks the first alternative, and scipy pulls in pythran with a C++
// compiler and Boost (about 800 MB).
func CodeInterpreterPackages() []string {
	return []string{
		"python3-ipykernel", "python3-jupyter-client", "python3-matplotlib",
		"python3-pandas", "python3-numpy", "python3-pil", "fonts-dejavu-core",
		"python3-munkres",
	}
}

// codeInterpreterSetupScript runs in the chroot after the base setup:
// matplotlib's font cache is built once, as the sandbox user, so that the
// first figure of every sandbox does not pay for it.
const codeInterpreterSetupScript = `set -eu
setpriv --reuid=1000 --regid=1000 --clear-groups env HOME=/home/user MPLBACKEND=Agg python3 -c 'import matplotlib.pyplot'
test -d /home/user/.cache/matplotlib
`

// File is a file a recipe writes into the root file system, owned by
// root.
type File struct {
	// Path is the absolute path inside the root file system.
	Path string
	// Mode is the file's permission bits.
	Mode uint32
	// Content is the file's content.
	Content []byte
}

// CodeInterpreterOptions configures BuildCodeInterpreter. With only IDBase
// set it builds the default recipe from DefaultMirror.
type CodeInterpreterOptions struct {
	// Mirror is the Debian mirror URL; empty means DefaultMirror.
	Mirror string
	// Progress receives a progress display (see BaseOptions.Progress).
	Progress io.Writer
	// Debootstrap is the debootstrap program (see BaseOptions.Debootstrap).
	Debootstrap string
	// IDBase is the base of the server's uid range (see
	// BaseOptions.IDBase).
	IDBase uint32
	// Server is the interpreter server's source; nil means the one built
	// into corral (interpreter.Server).
	Server []byte
}

// base returns the options of the base part of the recipe.
func (o CodeInterpreterOptions) base() BaseOptions {
	return BaseOptions{Mirror: o.Mirror, Progress: o.Progress, Debootstrap: o.Debootstrap, IDBase: o.IDBase}
}

// extraPackages returns the packages installed after debootstrap, sorted
// and without duplicates.
func (o CodeInterpreterOptions) extraPackages() []string {
	p := CodeInterpreterPackages()
	slices.Sort(p)
	return slices.Compact(p)
}

// files returns the files written into the root file system.
func (o CodeInterpreterOptions) files() []File {
	src := o.Server
	if src == nil {
		src = interpreter.Server()
	}
	return []File{{Path: interpreter.ServerPath, Mode: 0o644, Content: src}}
}

// Digest returns the hex sha256 of the code-interpreter recipe: its
// revision, the base recipe's digest (suite, mirror, uid base, packages,
// setup script), the extra package list, every file (path, mode, content)
// and the setup script. Builds with the same digest are interchangeable,
// so BuildCodeInterpreter caches by it.
func (o CodeInterpreterOptions) Digest() string {
	h := sha256.New()
	fmt.Fprintf(h, "corral-code-interpreter-recipe\x00%d\x00", CodeInterpreterRecipeVersion)
	fmt.Fprintf(h, "base\x00%s\x00", o.base().Digest())
	for _, p := range o.extraPackages() {
		fmt.Fprintf(h, "package\x00%s\x00", p)
	}
	for _, f := range o.files() {
		sum := sha256.Sum256(f.Content)
		fmt.Fprintf(h, "file\x00%s\x00%o\x00%d\x00%x\x00", f.Path, f.Mode, len(f.Content), sum)
	}
	fmt.Fprintf(h, "script\x00%d\x00%s", len(codeInterpreterSetupScript), codeInterpreterSetupScript)
	return hex.EncodeToString(h.Sum(nil))
}

// recipe returns the build steps of o.
func (o CodeInterpreterOptions) recipe() recipe {
	b := o.base()
	d := o.Digest()
	return recipe{
		name:          CodeInterpreterName,
		digest:        d,
		dirName:       CodeInterpreterName + "-" + d[:16],
		version:       fmt.Sprintf("%s-r%d-%s", BaseSuite, CodeInterpreterRecipeVersion, d[:12]),
		recipeVersion: CodeInterpreterRecipeVersion,
		opts:          b,
		packages:      b.packages(),
		extra:         o.extraPackages(),
		files:         o.files(),
		script:        codeInterpreterSetupScript,
	}
}

// CachedCodeInterpreter returns the cached build of opts' recipe without
// building anything, or an error when there is none.
func CachedCodeInterpreter(cacheDir string, opts CodeInterpreterOptions) (Template, error) {
	if cacheDir == "" {
		cacheDir = DefaultCacheDir()
	}
	r := opts.recipe()
	return openBuild(filepath.Join(cacheDir, r.dirName), r.digest)
}
