package dra

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"
)

// Mount is one mount a CDI spec adds to a container.
type Mount struct {
	HostPath      string   `json:"hostPath"`
	ContainerPath string   `json:"containerPath"`
	Type          string   `json:"type,omitempty"`
	Options       []string `json:"options,omitempty"`
}

// Edits are the container edits of a CDI spec or device, as far as the node's books follow them: env
// ("NAME=VALUE") and mounts. Device nodes and hooks are read but only listed.
type Edits struct {
	Env         []string     `json:"env,omitempty"`
	Mounts      []Mount      `json:"mounts,omitempty"`
	DeviceNodes []deviceNode `json:"deviceNodes,omitempty"`
	Hooks       []hook       `json:"hooks,omitempty"`
}

type deviceNode struct {
	Path string `json:"path"`
}

type hook struct {
	HookName string `json:"hookName"`
	Path     string `json:"path"`
}

// spec is one CDI spec file: cdiVersion, kind ("vendor/class"), devices and spec-wide container edits.
type spec struct {
	CDIVersion string `json:"cdiVersion"`
	Kind       string `json:"kind"`
	Devices    []struct {
		Name           string `json:"name"`
		ContainerEdits Edits  `json:"containerEdits"`
	} `json:"devices"`
	ContainerEdits Edits `json:"containerEdits"`
}

// Injected is what a container gets from its CDI devices, in the order the devices were named: the env (later
// names override earlier ones, as the OCI spec's env list does), the mounts, and the spec files they came from.
// A spec file that cannot be read or parsed is skipped, as the runtimes' CDI cache skips it; its error is named
// when a device is then unresolvable.
type Injected struct {
	Env    map[string]string `json:"env"`
	Mounts []Mount           `json:"mounts"`
	Specs  []string          `json:"specs"`
}

// UnresolvableError names the CDI devices no valid spec file in the CDI directories defines: a container
// runtime refuses to create the container then. SpecErrors are the spec files that could not be read.
type UnresolvableError struct {
	Devices    []string
	SpecErrors []string
}

func (e *UnresolvableError) Error() string {
	msg := "failed to inject CDI devices: unresolvable CDI devices " + strings.Join(e.Devices, ", ")
	if len(e.SpecErrors) > 0 {
		msg += " (spec files skipped: " + strings.Join(e.SpecErrors, "; ") + ")"
	}
	return msg
}

// Resolve reads the CDI spec files (*.json, *.yaml, *.yml) of dirs, as a container runtime's CDI cache does
// (a later directory takes precedence over an earlier one for a device both define), and applies the edits of
// the named devices ("vendor/class=name"): each spec's own containerEdits once, then each device's, a device
// named twice applied once (the DRA manager of 1.36.3 names a claim's devices twice after a restart: it prepares
// the claims of its checkpoint again and appends the driver's answer to what the checkpoint held).
// The spec files are read afresh on every call: a driver writes them just before it answers
// NodePrepareResources.
func Resolve(dirs []string, devices []string) (Injected, error) {
	out := Injected{Env: map[string]string{}, Mounts: []Mount{}, Specs: []string{}}
	if len(devices) == 0 {
		return out, nil
	}
	type found struct {
		file string
		spec *spec
		idx  int
	}
	known := map[string]found{}
	var specErrors []string
	for _, dir := range dirs {
		files, err := specFiles(dir)
		if err != nil {
			specErrors = append(specErrors, err.Error())
			continue
		}
		for _, f := range files {
			s, err := readSpec(f)
			if err != nil {
				specErrors = append(specErrors, err.Error())
				continue
			}
			for i, d := range s.Devices {
				known[s.Kind+"="+d.Name] = found{file: f, spec: s, idx: i}
			}
		}
	}
	var missing []string
	specApplied := map[string]bool{}
	deviceApplied := map[string]bool{}
	for _, id := range devices {
		if deviceApplied[id] {
			continue
		}
		deviceApplied[id] = true
		f, ok := known[id]
		if !ok {
			missing = append(missing, id)
			continue
		}
		if !specApplied[f.file] {
			specApplied[f.file] = true
			out.Specs = append(out.Specs, f.file)
			apply(&out, f.spec.ContainerEdits)
		}
		apply(&out, f.spec.Devices[f.idx].ContainerEdits)
	}
	if len(missing) > 0 {
		return out, &UnresolvableError{Devices: missing, SpecErrors: specErrors}
	}
	return out, nil
}

func apply(out *Injected, e Edits) {
	for _, kv := range e.Env {
		name, value, _ := strings.Cut(kv, "=")
		out.Env[name] = value
	}
	out.Mounts = append(out.Mounts, e.Mounts...)
}

func specFiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read CDI directory %s: %w", dir, err)
	}
	var files []string
	for _, e := range entries {
		ext := filepath.Ext(e.Name())
		if e.Type().IsRegular() && (ext == ".json" || ext == ".yaml" || ext == ".yml") {
			files = append(files, filepath.Join(dir, e.Name()))
		}
	}
	sort.Strings(files)
	return files, nil
}

func readSpec(path string) (*spec, error) {
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return &spec{}, nil // removed since the directory was listed (a driver's unprepare)
	}
	if err != nil {
		return nil, fmt.Errorf("read CDI spec %s: %w", path, err)
	}
	s := &spec{}
	if err := yaml.Unmarshal(data, s); err != nil {
		return nil, fmt.Errorf("CDI spec %s is neither JSON nor YAML of a CDI spec: %w", path, err)
	}
	if kind := s.Kind; strings.Count(kind, "/") != 1 || strings.HasPrefix(kind, "/") || strings.HasSuffix(kind, "/") {
		return nil, fmt.Errorf("CDI spec %s: kind %q is not vendor/class (e.g. gpu.gpushare.io/gpu)", path, kind)
	}
	return s, nil
}
