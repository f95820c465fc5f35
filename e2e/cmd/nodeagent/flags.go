package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/klog/v2"
)

type options struct {
	nodeName     string
	root         string
	kubeconfig   string
	standalone   bool
	statusPeriod time.Duration
	cpu          resource.Quantity
	memory       resource.Quantity
	pods         resource.Quantity
	controlAddr  string
	// DRA (with --kubeconfig): the plugins-registry directory the plugin watcher watches and the CDI spec
	// directories the runtime reads (default: <root>/plugins_registry and <root>/cdi).
	pluginsRegistryDir string
	cdiDirs            []string
}

// dirList is a repeatable directory flag.
type dirList []string

func (d *dirList) String() string { return strings.Join(*d, ",") }

func (d *dirList) Set(v string) error {
	if v == "" {
		return errors.New("an empty directory: give a path such as /tmp/node-1/cdi")
	}
	*d = append(*d, v)
	return nil
}

// parseFlags reads the command line; its errors say what to change.
func parseFlags(args []string, out io.Writer) (options, error) {
	fs := flag.NewFlagSet("nodeagent", flag.ContinueOnError)
	fs.SetOutput(out)
	klog.InitFlags(fs)
	var o options
	var cpu, memory, pods string
	fs.StringVar(&o.nodeName, "node-name", "", "the node's name (required)")
	fs.StringVar(&o.root, "root", "", "the node's directory: device-plugins/ and pod-resources/ are created in it (required)")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the apiserver the node registers with (or --standalone)")
	fs.BoolVar(&o.standalone, "standalone", false, "no apiserver: pods are admitted and ended through the control API")
	fs.DurationVar(&o.statusPeriod, "status-period", 10*time.Second, "how often the node status is posted (the kubelet's nodeStatusUpdateFrequency)")
	fs.StringVar(&cpu, "cpu", "64", "the node's cpu capacity")
	fs.StringVar(&memory, "memory", "256Gi", "the node's memory capacity")
	fs.StringVar(&pods, "pods", "110", "how many pods the node takes")
	fs.StringVar(&o.controlAddr, "control-addr", "127.0.0.1:0", "host:port of the control HTTP API (port 0: any free port)")
	fs.StringVar(&o.pluginsRegistryDir, "plugins-registry-dir", "", "the directory the plugin watcher watches for registration sockets (DRA and device plugins; default <root>/plugins_registry)")
	var cdi dirList
	fs.Var(&cdi, "cdi-dir", "a directory of CDI spec files the runtime reads for the containers' CDI devices; repeat for several, a later one taking precedence (default <root>/cdi)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q: every option is a --flag", fs.Arg(0))
	}
	if o.nodeName == "" {
		return o, errors.New("--node-name is required: give the node's name, e.g. --node-name node-1")
	}
	if o.root == "" {
		return o, errors.New("--root is required: give a directory for the node's sockets and checkpoints, e.g. --root /tmp/node-1")
	}
	if o.pluginsRegistryDir == "" {
		o.pluginsRegistryDir = filepath.Join(o.root, "plugins_registry")
	}
	o.cdiDirs = cdi
	if len(o.cdiDirs) == 0 {
		o.cdiDirs = []string{filepath.Join(o.root, "cdi")}
	}
	if (o.kubeconfig == "") == !o.standalone {
		return o, errors.New("give exactly one of --kubeconfig FILE (register with an apiserver) or --standalone (no apiserver)")
	}
	if o.statusPeriod <= 0 {
		return o, fmt.Errorf("--status-period %s must be positive, e.g. 10s", o.statusPeriod)
	}
	for _, q := range []struct {
		name, val string
		into      *resource.Quantity
	}{{"--cpu", cpu, &o.cpu}, {"--memory", memory, &o.memory}, {"--pods", pods, &o.pods}} {
		v, err := resource.ParseQuantity(q.val)
		if err != nil || v.Sign() <= 0 {
			return o, fmt.Errorf("%s %q is not a positive quantity: use e.g. %s", q.name, q.val, map[string]string{"--cpu": "64", "--memory": "256Gi", "--pods": "110"}[q.name])
		}
		*q.into = v
	}
	return o, nil
}
