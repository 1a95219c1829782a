//go:build !linux

package template

import (
	"context"
	"errors"
	"os"
)

var errNotLinux = errors.New("templates can only be built on Linux")

// BuildBase builds the base template; it is only implemented on Linux.
func BuildBase(ctx context.Context, cacheDir string, opts BaseOptions) (Template, error) {
	return Template{}, errNotLinux
}

// BuildCodeInterpreter builds the code-interpreter template; it is only
// implemented on Linux.
func BuildCodeInterpreter(ctx context.Context, cacheDir string, opts CodeInterpreterOptions) (Template, error) {
	return Template{}, errNotLinux
}

// ShiftOwnership shifts the ownership of a tree; it is only implemented on
// Linux.
func ShiftOwnership(root string, offset int) error {
	return errNotLinux
}

// PrivateDir creates dir accessible to its owner only.
func PrivateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return os.Chmod(dir, 0o700)
}
