//go:build !linux

package template

import (
	"context"
	"io"
)

// ImportImage imports an OCI image as a build dir; it is only implemented
// on Linux.
func ImportImage(ctx context.Context, cacheDir string, src ImportSource, idBase uint32, progress io.Writer) (ImportResult, error) {
	return ImportResult{}, errNotLinux
}

// Inspect reports what a build dir holds; it is only implemented on Linux.
func Inspect(dir string, n int) (Inspection, error) {
	return Inspection{}, errNotLinux
}
