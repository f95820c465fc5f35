// Package driversock serves the node's fake driver socket: what a kernel driver knows and a process in a PID
// namespace cannot learn by itself. A process of the fake driver asks, over a unix stream socket, line by line:
//
//	pid\n        -> "<its pid on the node>\n" (the peer's SO_PEERCRED pid, which the kernel translates into the
//	                node agent's PID namespace, the node's)
//	alive <pid>\n -> "1\n" or "0\n" (whether that node pid runs)
//
// Anything else gets "error <what>\n". fakes/README.md describes the client side.
package driversock

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// Serve listens on path (re-created: a stale socket of an earlier run is removed) until ctx ends. A socket that
// answers there already is the node's, served by something that outlives this agent (as a kernel driver outlives
// the kubelet: the test cluster serves it for the node's life, so that containers started just before an agent
// restart, or running through it, still find their driver); it is left to serve.
func Serve(ctx context.Context, path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		_ = c.Close()
		klog.InfoS("the node's driver socket is served already: not serving it", "path", path)
		return nil
	}
	_ = os.Remove(path)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return fmt.Errorf("serve the driver socket %s: %w", path, err)
	}
	// every container's processes (any uid) must reach it, as /dev/nvidiactl is world-writable
	if err := os.Chmod(path, 0o666); err != nil {
		l.Close()
		return err
	}
	go func() {
		<-ctx.Done()
		l.Close()
	}()
	go func() {
		for {
			c, err := l.AcceptUnix()
			if err != nil {
				if ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
					klog.ErrorS(err, "driver socket accept")
					time.Sleep(50 * time.Millisecond)
					continue
				}
				return
			}
			go handle(c)
		}
	}()
	return nil
}

func handle(c *net.UnixConn) {
	defer c.Close()
	peer := peerPid(c)
	r := bufio.NewReader(c)
	for {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Minute))
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		if _, err := c.Write([]byte(Answer(strings.TrimSpace(line), peer) + "\n")); err != nil {
			return
		}
	}
}

func peerPid(c *net.UnixConn) int {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0
	}
	pid := 0
	_ = raw.Control(func(fd uintptr) {
		if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
			pid = int(cred.Pid)
		}
	})
	return pid
}

// Answer is the reply to one request line from a peer of node pid peer.
func Answer(req string, peer int) string {
	switch {
	case req == "pid":
		if peer <= 0 {
			return "error the peer's pid is unknown"
		}
		return strconv.Itoa(peer)
	case strings.HasPrefix(req, "alive "):
		n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(req, "alive ")))
		if err != nil || n <= 0 {
			return "error alive wants a positive pid"
		}
		if err := syscall.Kill(n, 0); err == nil || errors.Is(err, syscall.EPERM) {
			return "1"
		}
		return "0"
	default:
		return fmt.Sprintf("error unknown request %q (pid, alive <pid>)", req)
	}
}
