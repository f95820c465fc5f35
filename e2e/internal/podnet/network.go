// Package podnet gives each pod a network namespace of its own on the cluster's pod bridge: a veth pair whose
// node end is joined to the bridge (in a network namespace the test harness made, joined to nothing outside the
// machine) and whose pod end is the pod's eth0, with an address from this node's pod range (host-local address
// management: one file per address in use, so a restarted node agent knows them). Pods reach each other on the
// bridge and the cluster's service range through the bridge's address; nothing else is routed.
package podnet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// Network is one node's part of the pod network.
type Network struct {
	// BridgeNS is the network namespace holding the bridge (a name under /run/netns); "" for no pod network:
	// each pod then gets a namespace with its loopback only.
	BridgeNS string
	Bridge   string     // the bridge device in BridgeNS (default "br0")
	Cluster  *net.IPNet // the whole pod range (every node's), on-link on the bridge (e.g. 10.88.0.0/16)
	Node     *net.IPNet // this node's part of it, from which its pods' addresses come (e.g. 10.88.3.0/24)
	Gateway  net.IP     // the bridge's address, through which the service range is reached
	Services *net.IPNet // the service range (e.g. 10.0.0.0/24); nil: not routed
	Prefix   string     // prefix of the pods' namespace names (short: the names must be unique on the machine)
	StateDir string     // one file per address in use, named by the address, holding the pod UID

	mu sync.Mutex
}

// Sandbox is a pod's network: its namespace (a path for the OCI spec) and address.
type Sandbox struct {
	NetNS string `json:"netns"` // /run/netns/NAME
	Name  string `json:"name"`
	IP    string `json:"ip"`
}

func ip(ctx context.Context, args ...string) error {
	var out bytes.Buffer
	c := exec.CommandContext(ctx, "ip", args...)
	c.Stdout, c.Stderr = &out, &out
	if err := c.Run(); err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// nsName is the pod's namespace name: the prefix and the first 12 hex digits of its UID.
func (n *Network) nsName(uid string) string { return n.Prefix + shortUID(uid) }

func shortUID(uid string) string {
	s := strings.ReplaceAll(uid, "-", "")
	if len(s) > 12 {
		s = s[:12]
	}
	return s
}

// Setup makes the pod's network namespace, joins it to the bridge and gives it an address. It is idempotent: a
// pod whose namespace exists keeps it and its address.
func (n *Network) Setup(ctx context.Context, uid string) (Sandbox, error) {
	name := n.nsName(uid)
	sb := Sandbox{Name: name, NetNS: "/run/netns/" + name}
	if n.BridgeNS == "" {
		if !exists(sb.NetNS) {
			if err := ip(ctx, "netns", "add", name); err != nil {
				return sb, err
			}
		}
		return sb, ip(ctx, "-n", name, "link", "set", "lo", "up")
	}
	addr, err := n.assign(uid)
	if err != nil {
		return sb, err
	}
	sb.IP = addr.String()
	if exists(sb.NetNS) {
		return sb, nil // set up before (the node agent restarted)
	}
	ones, _ := n.Cluster.Mask.Size()
	host := "h" + shortUID(uid)
	steps := [][]string{
		{"netns", "add", name},
		{"-n", name, "link", "set", "lo", "up"},
		{"-n", n.BridgeNS, "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", name},
		{"-n", n.BridgeNS, "link", "set", host, "master", n.bridge(), "up"},
		{"-n", name, "addr", "add", fmt.Sprintf("%s/%d", addr, ones), "dev", "eth0"},
		{"-n", name, "link", "set", "eth0", "up"},
	}
	if n.Services != nil && n.Gateway != nil {
		steps = append(steps, []string{"-n", name, "route", "add", n.Services.String(), "via", n.Gateway.String()})
	}
	for _, s := range steps {
		if err := ip(ctx, s...); err != nil {
			_ = n.Teardown(ctx, uid)
			return sb, fmt.Errorf("set up the pod's network: %w", err)
		}
	}
	return sb, nil
}

func (n *Network) bridge() string {
	if n.Bridge == "" {
		return "br0"
	}
	return n.Bridge
}

// Teardown removes the pod's namespace (its veth pair goes with it) and frees its address.
func (n *Network) Teardown(ctx context.Context, uid string) error {
	name := n.nsName(uid)
	var errs []error
	if exists("/run/netns/" + name) {
		if err := ip(ctx, "netns", "del", name); err != nil {
			errs = append(errs, err)
		}
	}
	if n.BridgeNS != "" {
		_ = ip(ctx, "-n", n.BridgeNS, "link", "del", "h"+shortUID(uid)) // normally gone with the pod's end
		n.release(uid)
	}
	return errors.Join(errs...)
}

// assign is host-local address management: the pod's address if it has one, else the lowest free one of the
// node's range (its network and broadcast addresses, and the gateway, excluded).
func (n *Network) assign(uid string) (net.IP, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := os.MkdirAll(n.StateDir, 0o755); err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(n.StateDir)
	if err != nil {
		return nil, err
	}
	used := map[string]bool{}
	for _, e := range entries {
		data, _ := os.ReadFile(filepath.Join(n.StateDir, e.Name()))
		if strings.TrimSpace(string(data)) == uid {
			return net.ParseIP(e.Name()), nil
		}
		used[e.Name()] = true
	}
	base := n.Node.IP.To4()
	ones, bits := n.Node.Mask.Size()
	size := 1 << (bits - ones)
	for i := 2; i < size-1; i++ {
		cand := make(net.IP, 4)
		copy(cand, base)
		v := uint32(cand[0])<<24 | uint32(cand[1])<<16 | uint32(cand[2])<<8 | uint32(cand[3])
		v += uint32(i)
		cand = net.IPv4(byte(v>>24), byte(v>>16), byte(v>>8), byte(v)).To4()
		if used[cand.String()] || (n.Gateway != nil && cand.Equal(n.Gateway)) {
			continue
		}
		if err := os.WriteFile(filepath.Join(n.StateDir, cand.String()), []byte(uid), 0o644); err != nil {
			return nil, err
		}
		return cand, nil
	}
	return nil, fmt.Errorf("no free address in the node's pod range %s (%d pods hold one)", n.Node, len(used))
}

func (n *Network) release(uid string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	entries, _ := os.ReadDir(n.StateDir)
	for _, e := range entries {
		p := filepath.Join(n.StateDir, e.Name())
		if data, _ := os.ReadFile(p); strings.TrimSpace(string(data)) == uid {
			_ = os.Remove(p)
		}
	}
}

// Owned lists the pod namespaces of this node (by its prefix) that exist on the machine.
func (n *Network) Owned() []string {
	entries, _ := os.ReadDir("/run/netns")
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), n.Prefix) {
			out = append(out, e.Name())
		}
	}
	return out
}

// DeleteNS removes a namespace by name (cleanup of what no pod holds).
func DeleteNS(ctx context.Context, name string) error { return ip(ctx, "netns", "del", name) }

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
