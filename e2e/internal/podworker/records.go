package podworker

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/gpushare/devplugin/e2e/internal/oci"
)

// Each run of a container keeps its record in <pod dir>/containers/<name>-<n>/attempt.json, so that a restarted
// node agent finds its pods' containers (they run on while it is down, as containers outlive a kubelet).

func writeAttempt(a *attempt) error {
	data, err := json.Marshal(a)
	if err != nil {
		return err
	}
	tmp := filepath.Join(a.Dir, "attempt.json.tmp")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(a.Dir, "attempt.json"))
}

// readAttempts reads a pod's runs of each container, oldest first, with their shims' latest status.
func readAttempts(podDir string) map[string][]*attempt {
	out := map[string][]*attempt{}
	entries, _ := os.ReadDir(filepath.Join(podDir, "containers"))
	for _, e := range entries {
		name, nStr, ok := cut(e.Name())
		if !ok {
			continue
		}
		n, err := strconv.Atoi(nStr)
		if err != nil {
			continue
		}
		dir := filepath.Join(podDir, "containers", e.Name())
		data, err := os.ReadFile(filepath.Join(dir, "attempt.json"))
		if err != nil {
			continue
		}
		a := &attempt{}
		if json.Unmarshal(data, a) != nil {
			continue
		}
		a.N = n
		if st, err := oci.ReadStatus(filepath.Join(dir, "status")); err == nil {
			a.Status = st
		}
		if a.running() && !oci.Alive(a.Status.ShimPid) {
			// its shim died without recording the end (a machine-level kill): the run is over
			a.Status.State, a.Status.ExitCode = oci.StateExited, 255
			a.Status.Message = "the container's shim is gone; its exit status is unknown"
		}
		out[name] = append(out[name], a)
	}
	for _, runs := range out {
		sort.Slice(runs, func(i, j int) bool { return runs[i].N < runs[j].N })
	}
	return out
}

// cut splits "<name>-<n>" at its last dash.
func cut(s string) (string, string, bool) {
	i := strings.LastIndex(s, "-")
	if i <= 0 {
		return "", "", false
	}
	return s[:i], s[i+1:], true
}

// killShims ends every shim still running under pods/ (the node's end).
func killShims(podsDir string) {
	pods, _ := os.ReadDir(podsDir)
	for _, p := range pods {
		for _, runs := range readAttempts(filepath.Join(podsDir, p.Name())) {
			for _, a := range runs {
				if a.Status.ShimPid > 0 && oci.Alive(a.Status.ShimPid) && isShim(a.Status.ShimPid) {
					_ = syscall.Kill(a.Status.ShimPid, syscall.SIGKILL)
				}
			}
		}
	}
}

func isShim(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && strings.Contains(string(data), "containershim")
}

// unmountUnder unmounts every mount point below dir, deepest first.
func unmountUnder(dir string) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	dir = filepath.Clean(dir)
	var points []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			points = append(points, f[4])
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	for _, p := range points {
		_ = unix.Unmount(p, unix.MNT_DETACH)
	}
}

func logsFromDisk(podDir, container string, previous bool) ([]byte, error) {
	dir := filepath.Join(podDir, "logs", container)
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) == 0 {
		return nil, fmt.Errorf("container %q has no logs on this node", container)
	}
	var ns []int
	for _, e := range entries {
		if n, err := strconv.Atoi(strings.TrimSuffix(e.Name(), ".log")); err == nil {
			ns = append(ns, n)
		}
	}
	sort.Ints(ns)
	i := len(ns) - 1
	if previous {
		i--
	}
	if i < 0 {
		return nil, fmt.Errorf("previous terminated container %q not found", container)
	}
	return os.ReadFile(filepath.Join(dir, fmt.Sprintf("%d.log", ns[i])))
}
