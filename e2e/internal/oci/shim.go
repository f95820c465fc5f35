package oci

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Shim states, in the order a container goes through them.
const (
	StateCreated = "created" // runc create succeeded: the init process waits for start
	StateRunning = "running" // runc start succeeded
	StateExited  = "exited"  // the init process ended: ExitCode (128+n for a signal)
	StateFailed  = "failed"  // runc create or start failed: Message says why; the process never ran
)

// ShimStatus is what the shim records of its container, in <container dir>/status (JSON, replaced atomically).
type ShimStatus struct {
	State      string    `json:"state"`
	ShimPid    int       `json:"shimPid"`
	Pid        int       `json:"pid,omitempty"`
	CreatedAt  time.Time `json:"createdAt"`
	StartedAt  time.Time `json:"startedAt,omitzero"`
	FinishedAt time.Time `json:"finishedAt,omitzero"`
	ExitCode   int       `json:"exitCode"`
	Signal     int       `json:"signal,omitempty"`
	Message    string    `json:"message,omitempty"`
}

// ReadStatus reads a shim's status file.
func ReadStatus(path string) (ShimStatus, error) {
	var st ShimStatus
	data, err := os.ReadFile(path)
	if err != nil {
		return st, err
	}
	err = json.Unmarshal(data, &st)
	return st, err
}

func writeStatus(path string, st ShimStatus) error {
	data, err := json.Marshal(st)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// ShimArgs are the container shim's arguments (`nodeagent container-shim ...`).
type ShimArgs struct {
	Runc   Runc
	Bundle string // the bundle directory (config.json, rootfs)
	ID     string
	Log    string // the container's output (stdout and stderr), appended
	Status string // the status file
}

// Args is the shim's command line after the subcommand.
func (a ShimArgs) Args() []string {
	return []string{"--runc", a.Runc.Binary, "--runc-root", a.Runc.Root, "--bundle", a.Bundle, "--id", a.ID,
		"--log", a.Log, "--status", a.Status}
}

// ParseShimArgs reads the shim's command line.
func ParseShimArgs(args []string) (ShimArgs, error) {
	fs := flag.NewFlagSet("container-shim", flag.ContinueOnError)
	var a ShimArgs
	fs.StringVar(&a.Runc.Binary, "runc", "runc", "the runc binary")
	fs.StringVar(&a.Runc.Root, "runc-root", "", "runc's state directory")
	fs.StringVar(&a.Bundle, "bundle", "", "the container's bundle")
	fs.StringVar(&a.ID, "id", "", "the container's id")
	fs.StringVar(&a.Log, "log", "", "the container's log file")
	fs.StringVar(&a.Status, "status", "", "the status file")
	if err := fs.Parse(args); err != nil {
		return a, err
	}
	for name, v := range map[string]string{"--runc-root": a.Runc.Root, "--bundle": a.Bundle, "--id": a.ID, "--log": a.Log, "--status": a.Status} {
		if v == "" {
			return a, fmt.Errorf("%s is required", name)
		}
	}
	return a, nil
}

// RunShim is the container shim: it makes itself the subreaper of the container's init process, creates and starts
// the container with runc (the container's stdout and stderr are the log file), records each step in the status
// file, waits for the init process to end and records its exit. It runs in a session of its own, so the node
// agent may stop or crash while its containers run on, as containers outlive a kubelet's restart.
func RunShim(a ShimArgs) error {
	signal.Ignore(syscall.SIGHUP, syscall.SIGINT, syscall.SIGTERM, syscall.SIGPIPE)
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("become the subreaper: %w", err)
	}
	st := ShimStatus{ShimPid: os.Getpid(), CreatedAt: time.Now()}
	fail := func(step string, err error) error {
		st.State, st.Message, st.FinishedAt, st.ExitCode = StateFailed, err.Error(), time.Now(), 128
		if werr := writeStatus(a.Status, st); werr != nil {
			return fmt.Errorf("%s: %v (and recording it: %v)", step, err, werr)
		}
		return nil
	}
	logf, err := os.OpenFile(a.Log, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
	if err != nil {
		return fail("open the log", err)
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return fail("open /dev/null", err)
	}
	runcLog := filepath.Join(a.Bundle, "runc.log")
	pidFile := filepath.Join(a.Bundle, "init.pid")
	ctx := context.Background()
	create := exec.CommandContext(ctx, a.Runc.Binary, "--root", a.Runc.Root, "--log", runcLog, "--log-format", "json",
		"create", "--no-pivot", "--bundle", a.Bundle, "--pid-file", pidFile, a.ID)
	create.Stdin, create.Stdout, create.Stderr = devnull, logf, logf
	if err := create.Run(); err != nil {
		return fail("runc create", runcError(runcLog, err))
	}
	pid, err := readPid(pidFile)
	if err != nil {
		return fail("read the init pid", err)
	}
	st.State, st.Pid = StateCreated, pid
	if err := writeStatus(a.Status, st); err != nil {
		return err
	}
	start := exec.CommandContext(ctx, a.Runc.Binary, "--root", a.Runc.Root, "--log", runcLog, "--log-format", "json", "start", a.ID)
	start.Stdin, start.Stdout, start.Stderr = devnull, logf, logf
	if err := start.Run(); err != nil {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		return fail("runc start", runcError(runcLog, err))
	}
	st.State, st.StartedAt = StateRunning, time.Now()
	if err := writeStatus(a.Status, st); err != nil {
		return err
	}
	_ = logf.Close()
	for {
		var ws unix.WaitStatus
		got, err := unix.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil { // ECHILD: the init process was reaped elsewhere; it is gone
			st.State, st.FinishedAt, st.ExitCode, st.Message = StateExited, time.Now(), 255, "the container's exit status was lost: "+err.Error()
			return writeStatus(a.Status, st)
		}
		if got != pid {
			continue
		}
		st.State, st.FinishedAt = StateExited, time.Now()
		switch {
		case ws.Exited():
			st.ExitCode = ws.ExitStatus()
		case ws.Signaled():
			st.Signal = int(ws.Signal())
			st.ExitCode = 128 + st.Signal
		}
		return writeStatus(a.Status, st)
	}
}

func readPid(path string) (int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(data)))
}

// runcError is runc's own last error message from its JSON log (what containerd reports as the task's error),
// else err.
func runcError(logPath string, err error) error {
	f, ferr := os.Open(logPath)
	if ferr != nil {
		return err
	}
	defer f.Close()
	var last string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var entry struct {
			Level string `json:"level"`
			Msg   string `json:"msg"`
		}
		if json.Unmarshal(sc.Bytes(), &entry) == nil && entry.Level == "error" && entry.Msg != "" {
			last = entry.Msg
		}
	}
	if last == "" {
		return err
	}
	return errors.New(last)
}
