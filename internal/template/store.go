package template

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
)

// Store maps template names to build dirs. Each registered name is a
// symbolic link dir/<name> pointing at the absolute path of a build dir.
// Registration replaces the link atomically, so a concurrent Resolve sees
// either the old or the new template, never a missing one.
type Store struct {
	dir string
}

// OpenStore opens (creating it if needed) the store in directory dir.
func OpenStore(dir string) (*Store, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("open template store %s: %w", dir, err)
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return nil, fmt.Errorf("open template store: %w", err)
	}
	return &Store{dir: abs}, nil
}

// Dir returns the store's directory.
func (s *Store) Dir() string { return s.dir }

// Register registers the build dir buildDir under name, replacing any
// previous registration of name. buildDir must hold a complete manifest
// and a rootfs directory.
func (s *Store) Register(name, buildDir string) error {
	if err := ValidateName(name); err != nil {
		return fmt.Errorf("register template: %w", err)
	}
	abs, err := filepath.Abs(buildDir)
	if err != nil {
		return fmt.Errorf("register template %s: %w", name, err)
	}
	if _, err := ReadManifest(abs); err != nil {
		return fmt.Errorf("register template %s: %w", name, err)
	}
	tmp, err := os.MkdirTemp(s.dir, ".register-")
	if err != nil {
		return fmt.Errorf("register template %s: %w", name, err)
	}
	defer os.RemoveAll(tmp)
	link := filepath.Join(tmp, "link")
	if err := os.Symlink(abs, link); err != nil {
		return fmt.Errorf("register template %s: %w", name, err)
	}
	// rename(2) replaces an existing symlink atomically; it cannot replace
	// a directory, which protects a directory someone put there by hand.
	if err := os.Rename(link, filepath.Join(s.dir, name)); err != nil {
		return fmt.Errorf("register template %s: %w", name, err)
	}
	return nil
}

// Resolve returns the template registered under name. An unknown name gives
// an error wrapping ErrNotFound; an invalid one, ErrInvalidName.
func (s *Store) Resolve(name string) (Template, error) {
	if err := ValidateName(name); err != nil {
		return Template{}, fmt.Errorf("resolve template: %w", err)
	}
	target, err := os.Readlink(filepath.Join(s.dir, name))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return Template{}, fmt.Errorf("resolve template %s: %w", name, ErrNotFound)
		}
		return Template{}, fmt.Errorf("resolve template %s: %w", name, err)
	}
	if !filepath.IsAbs(target) {
		target = filepath.Join(s.dir, target)
	}
	t, err := templateFromDir(name, target)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			// The link dangles: the build dir was removed.
			return Template{}, fmt.Errorf("resolve template %s: build dir %s is gone: %w", name, target, ErrNotFound)
		}
		return Template{}, fmt.Errorf("resolve template %s: %w", name, err)
	}
	return t, nil
}

// List returns all registered templates, sorted by name. Entries that do not
// resolve (a removed build dir, a damaged manifest) are left out.
func (s *Store) List() ([]Template, error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("list templates: %w", err)
	}
	var out []Template
	for _, e := range ents {
		if e.Type()&fs.ModeSymlink == 0 || ValidateName(e.Name()) != nil {
			continue
		}
		t, err := s.Resolve(e.Name())
		if err != nil {
			continue
		}
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Remove unregisters name. The build dir is left in place. An unknown name
// gives an error wrapping ErrNotFound.
func (s *Store) Remove(name string) error {
	if err := ValidateName(name); err != nil {
		return fmt.Errorf("remove template: %w", err)
	}
	p := filepath.Join(s.dir, name)
	fi, err := os.Lstat(p)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove template %s: %w", name, ErrNotFound)
		}
		return fmt.Errorf("remove template %s: %w", name, err)
	}
	if fi.Mode()&fs.ModeSymlink == 0 {
		return fmt.Errorf("remove template %s: %s is not a registration link", name, p)
	}
	if err := os.Remove(p); err != nil {
		return fmt.Errorf("remove template %s: %w", name, err)
	}
	return nil
}
