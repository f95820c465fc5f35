package podworker

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/klog/v2"

	"github.com/gpushare/devplugin/e2e/internal/podnet"
	"github.com/gpushare/devplugin/e2e/internal/podsetup"
)

// The pod's sandbox: its network namespace and address (sandbox.json), its volumes (volumes/), and the files the
// kubelet manages for each container (etc-hosts, resolv.conf).

func readSandbox(dir string) (podnet.Sandbox, error) {
	var sb podnet.Sandbox
	data, err := os.ReadFile(filepath.Join(dir, "sandbox.json"))
	if err != nil {
		return sb, err
	}
	return sb, json.Unmarshal(data, &sb)
}

func (w *worker) hostsFile() string  { return filepath.Join(w.dir, "etc-hosts") }
func (w *worker) resolvFile() string { return filepath.Join(w.dir, "resolv.conf") }

func (w *worker) setUpSandbox(ctx context.Context) error {
	pod := w.pod
	if err := os.MkdirAll(w.dir, 0o755); err != nil {
		return err
	}
	if !pod.Spec.HostNetwork {
		sb, err := w.rt.cfg.Net.Setup(ctx, string(pod.UID))
		if err != nil {
			return err
		}
		w.sandbox = sb
	} else {
		w.sandbox = podnet.Sandbox{IP: w.rt.cfg.HostIP}
	}
	data, _ := json.Marshal(w.sandbox)
	if err := os.WriteFile(filepath.Join(w.dir, "sandbox.json"), data, 0o644); err != nil {
		return err
	}
	vols, err := podsetup.SetUpVolumes(ctx, w.rt.cfg.Client, podsetup.Pod{Pod: pod, PodIP: w.sandbox.IP, HostIP: w.rt.cfg.HostIP},
		filepath.Join(w.dir, "volumes"))
	if err != nil {
		return err
	}
	w.volumes = vols
	w.hostsGen = w.rt.cfg.Names.Generation()
	if err := os.WriteFile(w.hostsFile(), []byte(w.hostsContent()), 0o644); err != nil {
		return err
	}
	search := fmt.Sprintf("search %s.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n", pod.Namespace)
	return os.WriteFile(w.resolvFile(), []byte(search), 0o644)
}

// hostsContent is the kubelet's managed hosts file: loopback names, the pod's own address and host name (with its
// subdomain's name when it has one), and the pod's hostAliases.
func (w *worker) hostsContent() string {
	pod := w.pod
	var b strings.Builder
	b.WriteString("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n" +
		"fe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n")
	host := pod.Name
	if pod.Spec.Hostname != "" {
		host = pod.Spec.Hostname
	}
	if ip := w.sandbox.IP; ip != "" && !pod.Spec.HostNetwork {
		names := host
		if pod.Spec.Subdomain != "" {
			names = fmt.Sprintf("%s.%s.%s.svc.cluster.local\t%s", host, pod.Spec.Subdomain, pod.Namespace, host)
		}
		fmt.Fprintf(&b, "%s\t%s\n", ip, names)
	}
	for _, a := range pod.Spec.HostAliases {
		fmt.Fprintf(&b, "\n# Entries added by HostAliases.\n%s\t%s\n", a.IP, strings.Join(a.Hostnames, "\t"))
	}
	if lines := w.rt.cfg.Names.HostsLines(pod.Namespace); lines != "" {
		b.WriteString("\n# The cluster's Services (what the cluster DNS would answer).\n" + lines)
	}
	return b.String()
}

// refreshHosts rewrites the pod's hosts file in place (its containers see it through a bind mount) when the
// cluster's Services changed.
func (w *worker) refreshHosts() {
	gen := w.rt.cfg.Names.Generation()
	if !w.sandboxReady || gen == w.hostsGen {
		return
	}
	w.hostsGen = gen
	f, err := os.OpenFile(w.hostsFile(), os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	_, _ = f.WriteString(w.hostsContent())
}

func (w *worker) tearDownSandbox(ctx context.Context) {
	podsetup.TearDownVolumes(filepath.Join(w.dir, "volumes"))
	if !w.pod.Spec.HostNetwork {
		if err := w.rt.cfg.Net.Teardown(ctx, string(w.pod.UID)); err != nil {
			klog.ErrorS(err, "tear down the pod's network", "pod", klog.KObj(w.pod), "podUID", w.pod.UID)
		}
	}
	w.sandboxReady = false
}

// cleanupPodDir removes what is left of a pod this runtime has no worker for (deleted while the node agent was
// down): its containers, mounts, network namespace and directory.
func (r *Runtime) cleanupPodDir(ctx context.Context, uid string) {
	dir := r.podDir(uid)
	if _, err := os.Stat(dir); err != nil {
		return
	}
	for _, runs := range readAttempts(dir) {
		for _, a := range runs {
			_ = r.cfg.Runc.Kill(ctx, a.ID, 9, true)
			_ = deleteWhenStopped(ctx, r.cfg.Runc, a.ID)
		}
	}
	unmountUnder(dir)
	if r.cfg.Net != nil {
		_ = r.cfg.Net.Teardown(ctx, uid)
	}
	_ = os.RemoveAll(dir)
}

// Orphans removes the pod directories of pods the node no longer has (known says which UIDs it has).
func (r *Runtime) Orphans(ctx context.Context, known func(uid string) bool) {
	entries, _ := os.ReadDir(filepath.Join(r.cfg.Root, "pods"))
	for _, e := range entries {
		if !known(e.Name()) {
			klog.InfoS("removing the containers of a pod the node no longer has", "podUID", e.Name())
			r.cleanupPodDir(ctx, e.Name())
		}
	}
}
