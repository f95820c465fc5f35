package oci

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Mount is one mount of a container, in the order given (a later mount may be beneath an earlier one).
type Mount struct {
	Source      string
	Destination string
	Type        string   // "bind" (default), "tmpfs", "overlay"
	Options     []string // for bind: "ro" or "rw" is added from ReadOnly
	ReadOnly    bool
}

// SpecInput is what a container's OCI spec is built from: the process the image and the pod spec describe, the
// namespaces of its pod, and its mounts.
type SpecInput struct {
	Args     []string
	Env      []string // NAME=VALUE, the last of a name wins (as containerd's WithEnv replaces in place)
	Cwd      string
	UID, GID uint32
	Groups   []uint32
	Hostname string
	// NetNS is the pod's network namespace (a path such as /run/netns/NAME); "" with HostNetwork false: a new,
	// empty one; HostNetwork: the node's.
	NetNS       string
	HostNetwork bool
	ReadOnly    bool // readOnlyRootFilesystem
	Privileged  bool
	CapAdd      []string // CAP_* names
	CapDrop     []string // CAP_* names, or "ALL"
	// NoNewPrivs is allowPrivilegeEscalation: false.
	NoNewPrivs bool
	Mounts     []Mount
}

// defaultCaps are the capabilities containerd gives a container that is not privileged (the Docker set).
var defaultCaps = []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL",
	"CAP_AUDIT_WRITE"}

// allCaps is every capability a privileged container gets.
var allCaps = []string{"CAP_AUDIT_CONTROL", "CAP_AUDIT_READ", "CAP_AUDIT_WRITE", "CAP_BLOCK_SUSPEND", "CAP_BPF",
	"CAP_CHECKPOINT_RESTORE", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
	"CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_KILL", "CAP_LEASE", "CAP_LINUX_IMMUTABLE", "CAP_MAC_ADMIN",
	"CAP_MAC_OVERRIDE", "CAP_MKNOD", "CAP_NET_ADMIN", "CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST", "CAP_NET_RAW",
	"CAP_PERFMON", "CAP_SETFCAP", "CAP_SETGID", "CAP_SETPCAP", "CAP_SETUID", "CAP_SYSLOG", "CAP_SYS_ADMIN",
	"CAP_SYS_BOOT", "CAP_SYS_CHROOT", "CAP_SYS_MODULE", "CAP_SYS_NICE", "CAP_SYS_PACCT", "CAP_SYS_PTRACE",
	"CAP_SYS_RAWIO", "CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_WAKE_ALARM"}

// capabilities is the container's capability set: the default set (all when privileged), less CapDrop, plus
// CapAdd, as the CRI's securityContext capabilities apply.
func capabilities(in SpecInput) []string {
	base := defaultCaps
	if in.Privileged {
		base = allCaps
	}
	set := map[string]bool{}
	for _, c := range base {
		set[c] = true
	}
	for _, c := range in.CapDrop {
		if strings.EqualFold(c, "ALL") {
			set = map[string]bool{}
			continue
		}
		delete(set, capName(c))
	}
	for _, c := range in.CapAdd {
		if strings.EqualFold(c, "ALL") {
			for _, a := range allCaps {
				set[a] = true
			}
			continue
		}
		set[capName(c)] = true
	}
	out := make([]string, 0, len(set))
	for c := range set {
		out = append(out, c)
	}
	sort.Strings(out)
	return out
}

func capName(c string) string {
	c = strings.ToUpper(c)
	if !strings.HasPrefix(c, "CAP_") {
		c = "CAP_" + c
	}
	return c
}

// BuildSpec is the container's OCI runtime spec: runc's defaults less what this machine lacks (the cgroup mount
// and resources: the node has no per-container cgroup hierarchy), with the pod's namespaces and the mounts.
func BuildSpec(in SpecInput) *specs.Spec {
	caps := capabilities(in)
	s := &specs.Spec{
		Version: specs.Version,
		Root:    &specs.Root{Path: "rootfs", Readonly: in.ReadOnly},
		Process: &specs.Process{
			Args: in.Args,
			Env:  dedupEnv(in.Env),
			Cwd:  orDefault(in.Cwd, "/"),
			User: specs.User{UID: in.UID, GID: in.GID, AdditionalGids: in.Groups},
			Capabilities: &specs.LinuxCapabilities{
				Bounding: caps, Effective: caps, Permitted: caps,
			},
			NoNewPrivileges: in.NoNewPrivs,
		},
		Hostname: in.Hostname,
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		},
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.MountNamespace}},
		},
	}
	if in.Privileged {
		s.Process.Capabilities.Ambient = nil
	} else {
		s.Linux.MaskedPaths = []string{"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
			"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi"}
		s.Linux.ReadonlyPaths = []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}
	}
	switch {
	case in.HostNetwork:
		// the node's network namespace: no entry
	case in.NetNS != "":
		s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: in.NetNS})
	default:
		s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.NetworkNamespace})
	}
	if in.HostNetwork {
		s.Hostname = "" // the node's UTS namespace stays the container's
		s.Linux.Namespaces = dropNS(s.Linux.Namespaces, specs.UTSNamespace)
	}
	for _, m := range in.Mounts {
		s.Mounts = append(s.Mounts, ociMount(m))
	}
	return s
}

func dropNS(in []specs.LinuxNamespace, t specs.LinuxNamespaceType) []specs.LinuxNamespace {
	out := in[:0]
	for _, n := range in {
		if n.Type != t {
			out = append(out, n)
		}
	}
	return out
}

func ociMount(m Mount) specs.Mount {
	switch m.Type {
	case "", "bind":
		opts := append([]string{"rbind"}, m.Options...)
		if m.ReadOnly {
			opts = append(opts, "ro")
		} else {
			opts = append(opts, "rw")
		}
		return specs.Mount{Destination: m.Destination, Type: "bind", Source: m.Source, Options: opts}
	default:
		opts := append([]string(nil), m.Options...)
		if m.ReadOnly {
			opts = append(opts, "ro")
		}
		return specs.Mount{Destination: m.Destination, Type: m.Type, Source: orDefault(m.Source, m.Type), Options: opts}
	}
}

// dedupEnv keeps one entry per name, the last value in the place of the first, as containerd's WithEnv does when
// it merges the image's env, then the CRI's.
func dedupEnv(env []string) []string {
	index := map[string]int{}
	var out []string
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if i, ok := index[name]; ok {
			out[i] = kv
			continue
		}
		index[name] = len(out)
		out = append(out, kv)
	}
	return out
}

func orDefault(v, d string) string {
	if v == "" {
		return d
	}
	return v
}

// WriteSpec writes the spec as bundle/config.json.
func WriteSpec(bundle string, s *specs.Spec) error {
	data, err := json.MarshalIndent(s, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(bundle, "config.json"), data, 0o600)
}
