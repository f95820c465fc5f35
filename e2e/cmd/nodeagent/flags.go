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
	// The container runtime (with --kubeconfig): "runc" runs every admitted container; "none" runs none (an
	// admitted pod is written Running at once).
	runtime           string
	images            string
	runcBinary        string
	shimBinary        string
	hostIP            string
	bridgeNS          string
	clusterCIDR       string
	nodeCIDR          string
	gateway           string
	serviceCIDR       string
	netnsPrefix       string
	nvidiaConfig      string
	nvidiaLibs        string
	nvidiaEnv         dirList
	acceptEnvvar      bool
	acceptVolumeMount bool
	crashBackoff      time.Duration
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
	fs.StringVar(&o.runtime, "runtime", "none", "the container runtime: runc (every admitted container runs, with --kubeconfig) or none")
	fs.StringVar(&o.images, "images", "", "the image table (JSON) the runtime resolves image references through (--runtime runc)")
	fs.StringVar(&o.runcBinary, "runc", "runc", "the runc binary")
	fs.StringVar(&o.shimBinary, "shim-binary", "", "the container shim (default: containershim beside this binary)")
	fs.StringVar(&o.hostIP, "host-ip", "127.0.0.1", "the node's address (status.hostIP)")
	fs.StringVar(&o.bridgeNS, "pod-bridge-netns", "", "the network namespace holding the pods' bridge br0 (empty: each pod gets a namespace with its loopback only)")
	fs.StringVar(&o.clusterCIDR, "cluster-cidr", "10.88.0.0/16", "every node's pod addresses: on-link on the bridge")
	fs.StringVar(&o.nodeCIDR, "pod-cidr", "", "this node's pod addresses, within --cluster-cidr (e.g. 10.88.1.0/24)")
	fs.StringVar(&o.gateway, "pod-gateway", "10.88.0.1", "the bridge's address, through which pods reach --service-cidr")
	fs.StringVar(&o.serviceCIDR, "service-cidr", "10.0.0.0/24", "the Services' addresses, routed through --pod-gateway")
	fs.StringVar(&o.netnsPrefix, "netns-prefix", "", "prefix of the pods' network namespace names (unique per node on the machine; default from the node name)")
	fs.StringVar(&o.nvidiaConfig, "nvidia-config", "", "the node's (fake) NVIDIA driver config (FAKE_NVML_CONFIG); empty: no driver is injected into containers")
	fs.StringVar(&o.nvidiaLibs, "nvidia-libs", "", "the directory of the driver's libcuda.so.1, libnvidia-ml.so.1 and nvidia-smi")
	fs.Var(&o.nvidiaEnv, "nvidia-env", "NAME=VALUE a GPU container's processes get with the driver (repeatable)")
	fs.BoolVar(&o.acceptEnvvar, "toolkit-accept-envvar-when-unprivileged", true, "the NVIDIA container toolkit's accept-nvidia-visible-devices-envvar-when-unprivileged")
	fs.BoolVar(&o.acceptVolumeMount, "toolkit-accept-volume-mounts", false, "the NVIDIA container toolkit's accept-nvidia-visible-devices-as-volume-mounts")
	fs.DurationVar(&o.crashBackoff, "crash-backoff", 10*time.Second, "the first crash-loop back-off (doubled per restart, at most 5 min)")
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
	switch o.runtime {
	case "none":
	case "runc":
		if o.standalone {
			return o, errors.New("--runtime runc needs --kubeconfig: a standalone node runs no containers")
		}
		if o.images == "" {
			return o, errors.New("--runtime runc needs --images FILE: the image table the containers' images come from")
		}
		if o.bridgeNS != "" && o.nodeCIDR == "" {
			return o, errors.New("--pod-bridge-netns needs --pod-cidr: this node's pod addresses, e.g. 10.88.1.0/24")
		}
		if o.netnsPrefix == "" {
			o.netnsPrefix = "p" + strings.ReplaceAll(o.nodeName, "-", "")
			if len(o.netnsPrefix) > 20 {
				o.netnsPrefix = o.netnsPrefix[:20]
			}
			o.netnsPrefix += "-"
		}
	default:
		return o, fmt.Errorf("--runtime %q: use runc or none", o.runtime)
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
