package registry

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"

	"github.com/corralhq/corral/internal/template"
)

// LayerInspection is the size and largest files of one layer of a template.
type LayerInspection struct {
	Layer   string              `json:"layer"` // "rootfs" or the layer's position from the top
	Bytes   int64               `json:"bytes"`
	Files   int                 `json:"files"`
	Largest []template.PathSize `json:"largest"`
}

// Inspect reports a template version's size by layer and the largest
// paths of each (top n), and an imported image's own layers.
func (r *Registry) Inspect(ctx context.Context, ref string, n int) ([]LayerInspection, []template.LayerInfo, error) {
	tv, err := r.Resolve(ctx, ref)
	if err != nil {
		return nil, nil, err
	}
	var out []LayerInspection
	var imageLayers []template.LayerInfo
	if in, err := template.Inspect(filepath.Dir(tv.RootFS), n); err == nil {
		out = append(out, LayerInspection{Layer: "rootfs", Bytes: in.Size, Files: in.Files, Largest: in.Largest})
		imageLayers = in.Layers
	} else if li, err := inspectDir(tv.RootFS, n); err == nil {
		out = append(out, li)
	}
	for i := len(tv.Layers) - 1; i >= 0; i-- {
		li, err := inspectDir(tv.Layers[i], n)
		if err != nil {
			return nil, nil, err
		}
		li.Layer = fmt.Sprintf("layer %d", len(tv.Layers)-i)
		out = append(out, li)
	}
	return out, imageLayers, nil
}

func inspectDir(dir string, n int) (LayerInspection, error) {
	li := LayerInspection{Layer: "rootfs"}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		li.Files++
		li.Bytes += info.Size()
		rel, _ := filepath.Rel(dir, p)
		li.Largest = append(li.Largest, template.PathSize{Path: "/" + rel, Bytes: info.Size()})
		return nil
	})
	sort.Slice(li.Largest, func(i, j int) bool { return li.Largest[i].Bytes > li.Largest[j].Bytes })
	if len(li.Largest) > n {
		li.Largest = li.Largest[:n]
	}
	return li, err
}

// LayerDigest is the content digest of a layer on top of a parent digest:
// sha256 over the parent digest and, for every path in order, its type,
// mode, owner, size, link target and content.
func LayerDigest(parent, dir string) (string, error) {
	h := sha256.New()
	io.WriteString(h, parent+"\n")
	var paths []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		paths = append(paths, p)
		return nil
	})
	if err != nil {
		return "", err
	}
	sort.Strings(paths)
	for _, p := range paths {
		fi, err := os.Lstat(p)
		if err != nil {
			return "", err
		}
		rel, _ := filepath.Rel(dir, p)
		fmt.Fprintf(h, "%s %o %d\n", rel, fi.Mode(), fi.Size())
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			t, _ := os.Readlink(p)
			io.WriteString(h, t+"\n")
		case fi.Mode().IsRegular():
			f, err := os.Open(p)
			if err != nil {
				return "", err
			}
			_, err = io.Copy(h, f)
			f.Close()
			if err != nil {
				return "", err
			}
		}
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}
