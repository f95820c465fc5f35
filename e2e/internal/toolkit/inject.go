package toolkit

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/gpushare/devplugin/e2e/internal/oci"
)

// Where the node's driver appears inside a container that gets it.
const (
	ContainerDriverDir = "/run/nvidia-fake"
	containerConfig    = ContainerDriverDir + "/config"
	containerState     = ContainerDriverDir + "/state"
	containerSocketDir = ContainerDriverDir + "/sock"
	// SocketName is the driver socket's file name in the node's socket directory.
	SocketName = "driver.sock"
	libDir     = "/usr/lib/x86_64-linux-gnu"
)

// Driver is the node's (fake) NVIDIA driver: its config and state files (shared by every process of the node),
// the directory of its socket, its libraries and nvidia-smi, and the knobs its processes read from their env.
type Driver struct {
	ConfigPath string   // FAKE_NVML_CONFIG of the node
	StatePath  string   // the node's state file (default ConfigPath + ".state")
	SocketDir  string   // the directory holding driver.sock (served by the node agent)
	LibDir     string   // libcuda.so.1, libnvidia-ml.so.1, nvidia-smi (build/fakes)
	Env        []string // NAME=VALUE knobs every GPU container's processes get (FAKE_CUDA_NS_PER_BLOCK, ...)
}

var (
	uuidRe   = regexp.MustCompile(`(?:^|\s)uuid=(\S+)`)
	minorRe  = regexp.MustCompile(`(?:^|\s)minor=(\d+)`)
	parentRe = regexp.MustCompile(`(?:^|\s)parent=(\S+)`)
	slotRe   = regexp.MustCompile(`(?:^|\s)slot=(\d+)`)
)

// GPUs reads the node's GPUs from the driver's config, in NVML index order, then its MIG devices (`mig` lines,
// fakes/fake_gpu_mig.h): each with its state slot as Index, its GPU's minor and its GPU as Parent.
func (d Driver) GPUs() ([]GPU, error) {
	f, err := os.Open(d.ConfigPath)
	if err != nil {
		return nil, fmt.Errorf("read the node's driver config: %w", err)
	}
	defer f.Close()
	var out []GPU
	sc := bufio.NewScanner(f)
	var migs []string
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "mig ") {
			migs = append(migs, line)
			continue
		}
		if !strings.HasPrefix(line, "gpu ") {
			continue
		}
		g := GPU{Index: len(out), Minor: len(out), Line: line}
		if m := uuidRe.FindStringSubmatch(line); m != nil {
			g.UUID = m[1]
		}
		if m := minorRe.FindStringSubmatch(line); m != nil {
			g.Minor, _ = strconv.Atoi(m[1])
		}
		out = append(out, g)
	}
	gpus := len(out)
	for _, line := range migs {
		m := GPU{Line: line, MIG: true}
		if x := uuidRe.FindStringSubmatch(line); x != nil {
			m.UUID = x[1]
		}
		x := slotRe.FindStringSubmatch(line)
		p := parentRe.FindStringSubmatch(line)
		if x == nil || p == nil {
			return nil, fmt.Errorf("the node's driver config has a mig line without slot= or parent=: %s", line)
		}
		m.Index, _ = strconv.Atoi(x[1])
		for _, g := range out[:gpus] {
			if g.UUID == p[1] {
				parent := g
				m.Minor, m.Parent = g.Minor, &parent
			}
		}
		if m.Parent == nil {
			return nil, fmt.Errorf("the node's driver config has a mig line whose parent is no gpu line: %s", line)
		}
		out = append(out, m)
	}
	return out, sc.Err()
}

func (d Driver) statePath() string {
	if d.StatePath != "" {
		return d.StatePath
	}
	return d.ConfigPath + ".state"
}

// containerConfigText is the container's view of the driver: the node's header lines, the node's state file and
// socket as the container sees them, and only the granted GPUs, each with its slot in the node's state.
func (d Driver) containerConfigText(gpus []GPU) (string, error) {
	data, err := os.ReadFile(d.ConfigPath)
	if err != nil {
		return "", fmt.Errorf("read the node's driver config: %w", err)
	}
	var b strings.Builder
	b.WriteString("# this container's view of the node's driver (written by the node's container runtime)\n")
	for _, line := range strings.Split(string(data), "\n") {
		t := strings.TrimSpace(line)
		if t == "" || strings.HasPrefix(t, "#") || strings.HasPrefix(t, "gpu ") || strings.HasPrefix(t, "mig ") ||
			strings.HasPrefix(t, "state=") || strings.HasPrefix(t, "driver_socket=") {
			continue
		}
		b.WriteString(t + "\n")
	}
	fmt.Fprintf(&b, "state=%s\ndriver_socket=%s/%s\n", containerState, containerSocketDir, SocketName)
	written := map[int]bool{}
	for _, g := range gpus { // a MIG device: its GPU's line (once), then its own line (which names its slot)
		whole := g
		if g.MIG {
			whole = *g.Parent
		}
		if !written[whole.Index] {
			written[whole.Index] = true
			fmt.Fprintf(&b, "%s slot=%d\n", whole.Line, whole.Index)
		}
		if g.MIG {
			fmt.Fprintf(&b, "%s\n", g.Line)
		}
	}
	return b.String(), nil
}

// Inject returns what a container granted g gets: the mounts (its driver view, the node's state and socket
// directory, the libraries of its capabilities, nvidia-smi, a device node per GPU) and the env that names the
// driver view. dir is the container's own directory, where its driver view is written. A container without the
// driver gets nothing.
func (d Driver) Inject(g Grant, dir string) ([]oci.Mount, []string, error) {
	if !g.Driver {
		return nil, nil, nil
	}
	text, err := d.containerConfigText(g.GPUs)
	if err != nil {
		return nil, nil, err
	}
	cfg := filepath.Join(dir, "nvidia-config")
	if err := os.WriteFile(cfg, []byte(text), 0o644); err != nil {
		return nil, nil, err
	}
	mounts := []oci.Mount{
		{Source: cfg, Destination: containerConfig, ReadOnly: true},
		{Source: d.statePath(), Destination: containerState},
		{Source: d.SocketDir, Destination: containerSocketDir},
		{Source: "/dev/null", Destination: "/dev/nvidiactl"},
	}
	if g.Capabilities["compute"] {
		mounts = append(mounts,
			oci.Mount{Source: filepath.Join(d.LibDir, "libcuda.so.1"), Destination: libDir + "/libcuda.so.1", ReadOnly: true},
			oci.Mount{Source: "/dev/null", Destination: "/dev/nvidia-uvm"})
	}
	if g.Capabilities["utility"] {
		mounts = append(mounts,
			oci.Mount{Source: filepath.Join(d.LibDir, "libnvidia-ml.so.1"), Destination: libDir + "/libnvidia-ml.so.1", ReadOnly: true})
		if smi := filepath.Join(d.LibDir, "nvidia-smi"); oci.FileExists(smi) {
			mounts = append(mounts, oci.Mount{Source: smi, Destination: "/usr/bin/nvidia-smi", ReadOnly: true})
		}
	}
	for _, gpu := range g.GPUs {
		mounts = append(mounts, oci.Mount{Source: "/dev/null", Destination: fmt.Sprintf("/dev/nvidia%d", gpu.Minor)})
	}
	env := append([]string{"FAKE_NVML_CONFIG=" + containerConfig}, d.Env...)
	return mounts, env, nil
}
