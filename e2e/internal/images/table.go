// Package images resolves a container's image reference through the image table the test harness owns: no
// registry can be reached, so each image the cluster can run is a root filesystem on this machine plus the
// image's own config (ENV, WORKDIR, ENTRYPOINT, CMD, USER), as a container runtime reads them from a pulled
// image.
package images

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
)

// Layer is a directory of this machine that the image carries at Destination: read-only, or with Writable a
// per-container copy-on-write view of it (an overlay whose lower layer is Source), so that a container may create
// files (and mount points) beneath it without touching the machine's own directory.
type Layer struct {
	Source      string `json:"source"`
	Destination string `json:"destination"`
	Writable    bool   `json:"writable,omitempty"`
}

// Image is one image of the table.
type Image struct {
	// Rootfs is the image's root filesystem: the lower layer of every container's root overlay.
	Rootfs string `json:"rootfs"`
	// Layers are directories of this machine the image carries beneath its root (e.g. /usr).
	Layers     []Layer  `json:"layers,omitempty"`
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"workingDir,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
	User       string   `json:"user,omitempty"` // uid[:gid]
	// ID is what the pod's status shows as imageID (default: the reference).
	ID string `json:"id,omitempty"`
}

// Table is the image table file: {"images": {"<reference>": Image}}.
type Table struct {
	Images map[string]Image `json:"images"`
}

// PullError is the error of an image the table does not have: the kubelet shows it as ErrImagePull.
type PullError struct {
	Ref, Table string
	Known      []string
}

func (e *PullError) Error() string {
	return fmt.Sprintf("failed to pull and unpack image %q: image not found: the node reaches no registry and its "+
		"image table %s has no such image (it has: %s)", e.Ref, e.Table, strings.Join(e.Known, ", "))
}

// Resolve reads the table file (afresh on every call: the harness may add images while the node runs) and returns
// the image of ref: the reference as written, or with ":latest" when it names no tag or digest.
func Resolve(path, ref string) (Image, error) {
	var t Table
	data, err := os.ReadFile(path)
	if err != nil {
		return Image{}, fmt.Errorf("read the image table: %w", err)
	}
	if err := json.Unmarshal(data, &t); err != nil {
		return Image{}, fmt.Errorf("the image table %s is not JSON of {\"images\": {...}}: %w", path, err)
	}
	for _, r := range candidates(ref) {
		if img, ok := t.Images[r]; ok {
			if img.ID == "" {
				img.ID = r
			}
			if img.Rootfs == "" {
				return Image{}, fmt.Errorf("image %q in the table %s has no rootfs", r, path)
			}
			return img, nil
		}
	}
	known := make([]string, 0, len(t.Images))
	for k := range t.Images {
		known = append(known, k)
	}
	sort.Strings(known)
	return Image{}, &PullError{Ref: ref, Table: path, Known: known}
}

func candidates(ref string) []string {
	out := []string{ref}
	last := ref[strings.LastIndex(ref, "/")+1:]
	if !strings.Contains(last, ":") && !strings.Contains(ref, "@") {
		out = append(out, ref+":latest")
	}
	return out
}
