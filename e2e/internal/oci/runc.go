// Package oci runs containers with a real OCI runtime (runc): a bundle per container, created and started through a
// small per-container shim process that outlives the node agent (as containerd's shim does) and records the
// container's exit, and the runtime's own commands for kill, delete, exec and list.
package oci

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Runc is one node's runc: the binary and the state directory (--root) that holds its containers.
type Runc struct {
	Binary string
	Root   string
}

func (r Runc) cmd(ctx context.Context, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, r.Binary, append([]string{"--root", r.Root}, args...)...)
}

// run runs one runc command and returns its error with what runc printed.
func (r Runc) run(ctx context.Context, args ...string) error {
	var out bytes.Buffer
	c := r.cmd(ctx, args...)
	c.Stdout, c.Stderr = &out, &out
	if err := c.Run(); err != nil {
		return fmt.Errorf("runc %s: %w: %s", args[0], err, strings.TrimSpace(out.String()))
	}
	return nil
}

// Kill sends sig to the container's init process (all its processes with all=true). A container that is gone or
// already stopped is not an error.
func (r Runc) Kill(ctx context.Context, id string, sig syscall.Signal, all bool) error {
	args := []string{"kill"}
	if all {
		args = append(args, "--all")
	}
	err := r.run(ctx, append(args, id, fmt.Sprint(int(sig)))...)
	if err != nil && gone(err) {
		return nil
	}
	return err
}

// Delete removes the container from runc's state (force: kill it first if it still runs). A container runc does
// not know is not an error.
func (r Runc) Delete(ctx context.Context, id string, force bool) error {
	args := []string{"delete"}
	if force {
		args = append(args, "--force")
	}
	err := r.run(ctx, append(args, id)...)
	if err != nil && gone(err) {
		return nil
	}
	return err
}

func gone(err error) bool {
	s := err.Error()
	return strings.Contains(s, "does not exist") || strings.Contains(s, "not running") ||
		strings.Contains(s, "container not running") || strings.Contains(s, "process already finished")
}

// State is one container as `runc list` shows it.
type State struct {
	ID     string `json:"id"`
	Pid    int    `json:"pid"`
	Status string `json:"status"`
	Bundle string `json:"bundle"`
}

// List is `runc list`: every container of this root.
func (r Runc) List(ctx context.Context) ([]State, error) {
	var out, errOut bytes.Buffer
	c := r.cmd(ctx, "list", "--format", "json")
	c.Stdout, c.Stderr = &out, &errOut
	if err := c.Run(); err != nil {
		return nil, fmt.Errorf("runc list: %w: %s", err, strings.TrimSpace(errOut.String()))
	}
	var states []State
	if s := strings.TrimSpace(out.String()); s != "" && s != "null" {
		if err := json.Unmarshal([]byte(s), &states); err != nil {
			return nil, fmt.Errorf("runc list: %w", err)
		}
	}
	return states, nil
}

// ExecResult is what a command run in a container gave.
type ExecResult struct {
	ExitCode int    `json:"exitCode"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	// Error is set when the command could not be run at all (no such container, no such executable).
	Error string `json:"error,omitempty"`
}

// maxExecOutput caps what an exec keeps of each stream.
const maxExecOutput = 4 << 20

// Exec runs args in the running container id (its namespaces, root, env and working directory), as `kubectl
// exec` does through the CRI, and waits for it, at most timeout.
func (r Runc) Exec(ctx context.Context, id string, args []string, stdin []byte, timeout time.Duration) ExecResult {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var out, errOut capped
	c := r.cmd(ctx, append([]string{"exec", id}, args...)...)
	c.Stdout, c.Stderr = &out, &errOut
	if stdin != nil {
		c.Stdin = bytes.NewReader(stdin)
	}
	c.WaitDelay = 2 * time.Second
	err := c.Run()
	res := ExecResult{Stdout: out.String(), Stderr: errOut.String()}
	var exit *exec.ExitError
	switch {
	case err == nil:
	case ctx.Err() != nil:
		res.ExitCode = -1
		res.Error = fmt.Sprintf("the command did not finish within %s", timeout)
	case errors.As(err, &exit):
		res.ExitCode = exit.ExitCode()
		if res.ExitCode == 255 || runcFailed(res.Stderr) {
			// runc's own failure (no such container, executable not found) rather than the command's exit
			res.Error = lastRuncError(res.Stderr)
		}
	default:
		res.ExitCode = -1
		res.Error = err.Error()
	}
	return res
}

func runcFailed(stderr string) bool {
	return strings.Contains(stderr, "level=error") || strings.Contains(stderr, "exec failed:")
}

// lastRuncError is the last line runc printed about its own failure.
func lastRuncError(stderr string) string {
	var last string
	sc := bufio.NewScanner(strings.NewReader(stderr))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			last = l
		}
	}
	return last
}

type capped struct{ bytes.Buffer }

func (c *capped) Write(p []byte) (int, error) {
	if room := maxExecOutput - c.Len(); room > 0 {
		if len(p) > room {
			c.Buffer.Write(p[:room])
		} else {
			c.Buffer.Write(p)
		}
	}
	return len(p), nil
}

// Alive says whether a process of this pid runs (as seen from this PID namespace).
func Alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// FileExists says whether path exists.
func FileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
