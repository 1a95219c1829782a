//go:build !linux

package inroot

import (
	"errors"
	"io/fs"
)

var errNotLinux = errors.New("inroot: only implemented on Linux (openat2)")

// ReadFile reads a regular file inside root; it is only implemented on
// Linux.
func ReadFile(root, name string, max int64) ([]byte, error) { return nil, errNotLinux }

// StatMode returns the type and mode of name inside root; it is only
// implemented on Linux.
func StatMode(root, name string) (fs.FileMode, error) { return 0, errNotLinux }

// RealDir checks that name is a real directory inside root; it is only
// implemented on Linux.
func RealDir(root, name string) error { return errNotLinux }
