// Package toolkit plays the NVIDIA container toolkit's part on the node: which of the node's GPUs a container is
// given (from NVIDIA_VISIBLE_DEVICES in legacy mode, from /var/run/nvidia-container-devices volume mounts, or from
// nvidia.com/gpu CDI devices) and what is injected into a container that gets the driver (the node's driver
// libraries, nvidia-smi, a device node per GPU). Here the driver is the project's fake one (fakes/): its
// libraries, its per-container view of the node's GPUs and the node's driver socket.
//
// The rules follow NVIDIA's nvidia-container-toolkit (cmd/nvidia-container-runtime-hook/container_config.go and
// internal/config/image/cuda_image.go; the docs' "Specialized Configurations" page): docs/testing.md lists each
// with its source.
package toolkit

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
)

// Env names the toolkit reads.
const (
	EnvVisibleDevices     = "NVIDIA_VISIBLE_DEVICES"
	EnvDriverCapabilities = "NVIDIA_DRIVER_CAPABILITIES"
	EnvCUDAVersion        = "CUDA_VERSION"
	EnvRequireCUDA        = "NVIDIA_REQUIRE_CUDA"
	// VolumeMountsRoot is where the volume-mounts strategy names the devices (deviceListAsVolumeMountsRoot).
	VolumeMountsRoot = "/var/run/nvidia-container-devices"
	// CDIKind is the kind of the CDI devices NVIDIA's generated spec names (nvidia.com/gpu=<index|uuid|all>).
	CDIKind = "nvidia.com/gpu"
)

// Config is the toolkit's node configuration (/etc/nvidia-container-runtime/config.toml).
type Config struct {
	// AcceptEnvvarUnprivileged is accept-nvidia-visible-devices-envvar-when-unprivileged (default true): an
	// unprivileged container's NVIDIA_VISIBLE_DEVICES is honoured.
	AcceptEnvvarUnprivileged bool
	// AcceptVolumeMounts is accept-nvidia-visible-devices-as-volume-mounts (default false): the devices named by
	// /dev/null mounts under /var/run/nvidia-container-devices are the container's, before any env.
	AcceptVolumeMounts bool
}

// DefaultConfig is the toolkit's shipped default.
func DefaultConfig() Config { return Config{AcceptEnvvarUnprivileged: true} }

// GPU is one GPU of the node, as its driver enumerates it.
type GPU struct {
	Index  int    // the node's NVML index (the state slot of the fake driver); a MIG device's state slot
	UUID   string // GPU-..., or MIG-... for a MIG device
	Minor  int    // /dev/nvidia<minor> (a MIG device's: its GPU's)
	Line   string // the fake driver's config line
	MIG    bool   // a MIG device, named by its MIG- UUID only
	Parent *GPU   // a MIG device's GPU
}

// Container is what the toolkit reads of a container: its final environment (image, device plugin, pod spec, CDI
// edits, merged as the runtime merges them), its mounts (source -> destination), the nvidia.com/gpu CDI devices
// named for it, and whether it is privileged (CAP_SYS_ADMIN).
type Container struct {
	Env        []string
	Mounts     map[string]string // destination -> source
	CDIDevices []string          // the names after "nvidia.com/gpu=": an index, a UUID or "all"
	Privileged bool
}

// Grant is the toolkit's decision for one container.
type Grant struct {
	// Driver is true when the container gets the driver (libraries, nvidia-smi): a GPU container, with or
	// without devices ("none").
	Driver bool
	GPUs   []GPU
	// Capabilities are the driver capabilities injected (utility: NVML and nvidia-smi; compute: libcuda).
	Capabilities map[string]bool
	// Source says where the device list came from: "env", "volume-mounts", "cdi", or "" for no GPU container.
	Source string
	// Notes are what the toolkit logs about its choice (e.g. an env it ignored).
	Notes []string
}

func envMap(env []string) map[string]string {
	m := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

// legacy is IsLegacy: CUDA_VERSION set and NVIDIA_REQUIRE_CUDA not.
func legacy(env map[string]string) bool {
	return env[EnvCUDAVersion] != "" && env[EnvRequireCUDA] == ""
}

// devicesFromEnv is DevicesFromEnvvars for NVIDIA_VISIBLE_DEVICES: nil for no GPU container (unset on a
// non-legacy image, empty, or containing "void"); ["all"] when unset on a legacy image.
func devicesFromEnv(env map[string]string) []string {
	v, set := env[EnvVisibleDevices]
	if !set {
		if legacy(env) {
			return []string{"all"}
		}
		return nil
	}
	var out []string
	for _, d := range strings.Split(v, ",") {
		if d = strings.TrimSpace(d); d != "" {
			if d == "void" {
				return nil
			}
			out = append(out, d)
		}
	}
	return out
}

// devicesFromMounts is getDevicesFromMounts: /dev/null mounted at /var/run/nvidia-container-devices/<device>.
func devicesFromMounts(mounts map[string]string) []string {
	var out []string
	root := filepath.Clean(VolumeMountsRoot)
	for dst, src := range mounts {
		if filepath.Clean(src) != "/dev/null" {
			continue
		}
		dst = filepath.Clean(dst)
		if !strings.HasPrefix(dst, root+"/") {
			continue
		}
		if d := strings.TrimPrefix(dst, root+"/"); d != "" {
			out = append(out, d)
		}
	}
	return sortedUnique(out)
}

func sortedUnique(in []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range in {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	// keep mount order deterministic
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j] < out[j-1]; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

// capabilities is getDriverCapabilities: unset on a legacy image -> all; unset or empty -> the default
// (utility, compute); otherwise the list ("all" for all).
func capabilities(env map[string]string) map[string]bool {
	v, set := env[EnvDriverCapabilities]
	caps := map[string]bool{}
	switch {
	case !set && legacy(env):
		v = "all"
	case v == "":
		v = "utility,compute"
	}
	for _, c := range strings.Split(v, ",") {
		if c = strings.TrimSpace(c); c != "" {
			caps[c] = true
		}
	}
	if caps["all"] {
		for _, c := range []string{"compute", "compat32", "graphics", "utility", "video", "display", "ngx"} {
			caps[c] = true
		}
	}
	return caps
}

// UnknownDeviceError is nvidia-container-cli's refusal of a device it cannot find: the container is not created.
type UnknownDeviceError struct{ ID string }

func (e *UnknownDeviceError) Error() string {
	return fmt.Sprintf("nvidia-container-cli: device error: %s: unknown device", e.ID)
}

// pick resolves device IDs ("all", "none", indices, UUIDs) against the node's GPUs.
func pick(ids []string, node []GPU) ([]GPU, error) {
	var out []GPU
	seen := map[int]bool{}
	add := func(g GPU) {
		if !seen[g.Index] {
			seen[g.Index] = true
			out = append(out, g)
		}
	}
	for _, id := range ids {
		switch {
		case id == "all":
			for _, g := range node {
				add(g)
			}
		case id == "none":
		default:
			g, ok := find(id, node)
			if !ok {
				return nil, &UnknownDeviceError{ID: id}
			}
			add(g)
		}
	}
	return out, nil
}

func find(id string, node []GPU) (GPU, bool) {
	if n, err := strconv.Atoi(id); err == nil {
		for _, g := range node {
			if !g.MIG && g.Index == n {
				return g, true
			}
		}
		return GPU{}, false
	}
	for _, g := range node {
		if strings.EqualFold(g.UUID, id) {
			return g, true
		}
	}
	return GPU{}, false
}

// Decide applies the toolkit's rules to one container. CDI devices of kind nvidia.com/gpu are injected whatever
// the env says (the CDI path does not read NVIDIA_VISIBLE_DEVICES); the legacy hook then adds what its own rules
// grant: the device list from volume mounts (when accepted and present), else from NVIDIA_VISIBLE_DEVICES (when the
// container is privileged or unprivileged envs are accepted).
func Decide(c Container, node []GPU, cfg Config) (Grant, error) {
	env := envMap(c.Env)
	g := Grant{Capabilities: capabilities(env)}
	if len(c.CDIDevices) > 0 {
		gpus, err := pick(c.CDIDevices, node)
		if err != nil {
			return Grant{}, fmt.Errorf("CDI device %s=%s: unresolvable CDI devices", CDIKind, err.(*UnknownDeviceError).ID)
		}
		g.Driver, g.GPUs, g.Source = true, gpus, "cdi"
		// the CDI spec NVIDIA generates injects compute and utility whatever the env says
		g.Capabilities["compute"], g.Capabilities["utility"] = true, true
	}
	var ids []string
	var from string
	if cfg.AcceptVolumeMounts {
		if ids = devicesFromMounts(c.Mounts); ids != nil {
			from = "volume-mounts"
		}
	}
	if ids == nil {
		if ids = devicesFromEnv(env); ids != nil {
			from = "env"
			if !c.Privileged && !cfg.AcceptEnvvarUnprivileged {
				g.Notes = append(g.Notes, fmt.Sprintf("Ignoring devices specified in NVIDIA_VISIBLE_DEVICES (privileged=false, accept-nvidia-visible-devices-envvar-when-unprivileged=false): %s", strings.Join(ids, ",")))
				ids, from = nil, ""
			}
		}
	}
	if ids == nil {
		return g, nil
	}
	gpus, err := pick(ids, node)
	if err != nil {
		return Grant{}, err
	}
	g.Driver = true
	for _, x := range gpus {
		if !contains(g.GPUs, x) {
			g.GPUs = append(g.GPUs, x)
		}
	}
	if g.Source == "" {
		g.Source = from
	} else {
		g.Source += "+" + from
	}
	return g, nil
}

func contains(gs []GPU, g GPU) bool {
	for _, x := range gs {
		if x.Index == g.Index {
			return true
		}
	}
	return false
}
