package podworker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	kubecontainer "k8s.io/kubernetes/pkg/kubelet/container"

	"github.com/gpushare/devplugin/e2e/internal/dra"
	"github.com/gpushare/devplugin/e2e/internal/images"
	"github.com/gpushare/devplugin/e2e/internal/oci"
	"github.com/gpushare/devplugin/e2e/internal/podsetup"
	"github.com/gpushare/devplugin/e2e/internal/toolkit"
)

// startTimeout bounds how long a container may take from its shim's start to runc's answer.
const startTimeout = 60 * time.Second

// The kubelet's waiting reasons.
const (
	reasonCreating    = "ContainerCreating"
	reasonPodInit     = "PodInitializing"
	reasonPull        = "ErrImagePull"
	reasonPullBackOff = "ImagePullBackOff"
	reasonConfig      = "CreateContainerConfigError"
	reasonCreate      = "CreateContainerError"
	reasonCrashLoop   = "CrashLoopBackOff"
)

// startFailure is a container that could not be started; wait is the waiting state it leaves (nil: it counts as a
// run that ended with a StartError).
type startFailure struct {
	wait *waiting
	err  error
}

func (s *startFailure) Error() string { return s.err.Error() }

func waitErr(reason string, err error) error {
	return &startFailure{wait: &waiting{Reason: reason, Message: err.Error()}, err: err}
}

// launch creates and starts one run of container c: image, env, mounts, the toolkit's GPU decision, the OCI
// bundle, the shim. It returns the run, or a startFailure.
func (w *worker) launch(ctx context.Context, c *ctr) (*attempt, error) {
	cfg := w.rt.cfg
	pod := w.pod
	img, err := images.Resolve(cfg.Images, c.spec.Image)
	if err != nil {
		var pe *images.PullError
		if errors.As(err, &pe) {
			return nil, waitErr(reasonPull, err)
		}
		return nil, waitErr(reasonPull, fmt.Errorf("failed to pull image %q: %w", c.spec.Image, err))
	}
	c.image, c.imageID = c.spec.Image, img.ID
	p := podsetup.Pod{Pod: pod, PodIP: w.sandbox.IP, HostIP: cfg.HostIP}
	podEnv, err := podsetup.Env(ctx, cfg.Client, p, &c.spec)
	if err != nil {
		return nil, waitErr(reasonConfig, err)
	}
	var devOpts struct {
		envs       []string
		mounts     []oci.Mount
		cdiNvidia  []string
		cdiOther   []string
		mountPaths map[string]string
	}
	devOpts.mountPaths = map[string]string{}
	if cfg.DeviceOptions != nil {
		opts, err := cfg.DeviceOptions(ctx, pod, &c.spec)
		if err != nil {
			return nil, waitErr(reasonConfig, fmt.Errorf("device plugin run options: %w", err))
		}
		if opts != nil {
			for _, e := range opts.Envs {
				devOpts.envs = append(devOpts.envs, e.Name+"="+e.Value)
			}
			for _, m := range opts.Mounts {
				devOpts.mounts = append(devOpts.mounts, oci.Mount{Source: m.HostPath, Destination: m.ContainerPath, ReadOnly: m.ReadOnly})
			}
			for _, d := range opts.Devices {
				devOpts.mounts = append(devOpts.mounts, oci.Mount{Source: d.PathOnHost, Destination: d.PathInContainer})
			}
			for _, d := range opts.CDIDevices {
				if kind, name, ok := strings.Cut(d.Name, "="); ok && kind == toolkit.CDIKind {
					devOpts.cdiNvidia = append(devOpts.cdiNvidia, name)
				} else {
					devOpts.cdiOther = append(devOpts.cdiOther, d.Name)
				}
			}
		}
	}
	// The environment as the runtime merges it: the image's, then the CRI's (device plugins first, then the pod
	// spec's), then what CDI devices inject.
	env := append(append(append([]string{}, img.Env...), devOpts.envs...), podEnv...)
	var cdiMounts []oci.Mount
	addCDI := func(inj *dra.Injected) {
		for _, k := range sortedEnvKeys(inj.Env) {
			env = append(env, k+"="+inj.Env[k])
		}
		for _, m := range inj.Mounts {
			cdiMounts = append(cdiMounts, oci.Mount{Source: m.HostPath, Destination: m.ContainerPath,
				ReadOnly: hasOpt(m.Options, "ro")})
		}
	}
	if len(devOpts.cdiOther) > 0 {
		inj, err := dra.Resolve(cfg.CDIDirs, devOpts.cdiOther)
		if err != nil {
			return nil, waitErr(reasonCreate, err)
		}
		addCDI(&inj)
	}
	if cfg.ClaimCDI != nil {
		if inj := cfg.ClaimCDI(pod, c.spec.Name); inj != nil {
			addCDI(inj)
		}
	}

	c.attempts++
	n := c.attempts - 1
	a := &attempt{N: n, ID: fmt.Sprintf("%s-%s-%d", shortID(string(pod.UID)), c.spec.Name, n),
		Dir: filepath.Join(w.dir, "containers", fmt.Sprintf("%s-%d", c.spec.Name, n)), Image: c.spec.Image, ImageID: img.ID}
	bundle := filepath.Join(a.Dir, "bundle")
	for _, d := range []string{filepath.Join(bundle, "rootfs"), filepath.Join(a.Dir, "upper"), filepath.Join(a.Dir, "work"), w.logDir(c.spec.Name)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, waitErr(reasonCreate, err)
		}
	}
	if err := writeAttempt(a); err != nil {
		return nil, waitErr(reasonCreate, err)
	}

	// Mounts: the image's layers, the pod's volumes, the files the kubelet manages, the device plugin's, CDI's.
	sc := c.spec.SecurityContext
	readOnly := sc != nil && sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem
	var mounts []oci.Mount
	var writableLayers []images.Layer
	for i, l := range img.Layers {
		if l.Writable {
			up, wk := filepath.Join(a.Dir, "layers", strconv.Itoa(i), "upper"), filepath.Join(a.Dir, "layers", strconv.Itoa(i), "work")
			_ = os.MkdirAll(up, 0o755)
			_ = os.MkdirAll(wk, 0o755)
			mounts = append(mounts, oci.Mount{Type: "overlay", Source: "overlay", Destination: l.Destination, ReadOnly: readOnly,
				Options: []string{"lowerdir=" + l.Source, "upperdir=" + up, "workdir=" + wk}})
			writableLayers = append(writableLayers, images.Layer{Source: up, Destination: l.Destination})
		} else {
			mounts = append(mounts, oci.Mount{Source: l.Source, Destination: l.Destination, ReadOnly: true})
		}
	}
	volMounts, err := podsetup.ContainerMounts(&c.spec, w.volumes, podEnv)
	if err != nil {
		return nil, waitErr(reasonConfig, err)
	}
	mounts = append(mounts, volMounts...)
	termLog := filepath.Join(a.Dir, "termination-log")
	_ = os.WriteFile(termLog, nil, 0o666)
	termPath := c.spec.TerminationMessagePath
	if termPath == "" {
		termPath = v1.TerminationMessagePathDefault
	}
	mounts = append(mounts,
		oci.Mount{Source: w.hostsFile(), Destination: "/etc/hosts"},
		oci.Mount{Source: w.resolvFile(), Destination: "/etc/resolv.conf", ReadOnly: true},
		oci.Mount{Source: termLog, Destination: termPath})
	mounts = append(mounts, devOpts.mounts...)
	mounts = append(mounts, cdiMounts...)

	privileged := sc != nil && sc.Privileged != nil && *sc.Privileged
	var capAdd, capDrop []string
	if sc != nil && sc.Capabilities != nil {
		for _, x := range sc.Capabilities.Add {
			capAdd = append(capAdd, string(x))
		}
		for _, x := range sc.Capabilities.Drop {
			capDrop = append(capDrop, string(x))
		}
	}
	sysAdmin := privileged
	for _, x := range capAdd {
		if strings.EqualFold(strings.TrimPrefix(strings.ToUpper(x), "CAP_"), "SYS_ADMIN") {
			sysAdmin = true
		}
	}
	if cfg.Driver != nil {
		node, err := cfg.Driver.GPUs()
		if err != nil {
			return nil, waitErr(reasonCreate, err)
		}
		dst := map[string]string{}
		for _, m := range mounts {
			dst[m.Destination] = m.Source
		}
		grant, err := toolkit.Decide(toolkit.Container{Env: env, Mounts: dst, CDIDevices: devOpts.cdiNvidia, Privileged: sysAdmin}, node, cfg.Toolkit)
		if err != nil {
			a.StartError = "failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create failed: " +
				"error running prestart hook #0: exit status 1, stdout: , stderr: " + err.Error()
			_ = writeAttempt(a)
			return a, nil
		}
		for _, note := range grant.Notes {
			klog.InfoS("toolkit", "pod", klog.KObj(pod), "container", c.spec.Name, "note", note)
		}
		inj, injEnv, err := cfg.Driver.Inject(grant, a.Dir)
		if err != nil {
			return nil, waitErr(reasonCreate, err)
		}
		mounts = append(mounts, inj...)
		env = append(env, injEnv...)
		klog.V(2).InfoS("toolkit grant", "pod", klog.KObj(pod), "container", c.spec.Name, "driver", grant.Driver,
			"gpus", gpuNames(grant.GPUs), "source", grant.Source)
	}
	// runc creates mount points inside the root overlay; beneath a writable layer they are made here, in the
	// layer's upper directory, so that a read-only layer (readOnlyRootFilesystem) can still take them.
	for _, m := range mounts {
		for _, l := range writableLayers {
			if rel, ok := under(m.Destination, l.Destination); ok {
				makeMountPoint(filepath.Join(l.Source, rel), m.Source)
			}
		}
	}

	envVars := make([]kubecontainer.EnvVar, 0, len(podEnv))
	for _, kv := range podEnv {
		k, v, _ := strings.Cut(kv, "=")
		envVars = append(envVars, kubecontainer.EnvVar{Name: k, Value: v})
	}
	command, args := kubecontainer.ExpandContainerCommandAndArgs(&c.spec, envVars)
	var argv []string
	switch {
	case len(command) > 0:
		argv = append(command, args...)
	case len(args) > 0:
		argv = append(append([]string{}, img.Entrypoint...), args...)
	default:
		argv = append(append([]string{}, img.Entrypoint...), img.Cmd...)
	}
	if len(argv) == 0 {
		return nil, waitErr(reasonCreate, errors.New("failed to generate container spec: no command specified"))
	}
	uid, gid := imageUser(img.User)
	if psc := pod.Spec.SecurityContext; psc != nil {
		if psc.RunAsUser != nil {
			uid = uint32(*psc.RunAsUser)
		}
		if psc.RunAsGroup != nil {
			gid = uint32(*psc.RunAsGroup)
		}
	}
	if sc != nil {
		if sc.RunAsUser != nil {
			uid = uint32(*sc.RunAsUser)
		}
		if sc.RunAsGroup != nil {
			gid = uint32(*sc.RunAsGroup)
		}
	}
	var groups []uint32
	if psc := pod.Spec.SecurityContext; psc != nil {
		for _, g := range psc.SupplementalGroups {
			groups = append(groups, uint32(g))
		}
	}
	hostname := pod.Name
	if pod.Spec.Hostname != "" {
		hostname = pod.Spec.Hostname
	}
	if len(hostname) > 63 {
		hostname = hostname[:63]
	}
	spec := oci.BuildSpec(oci.SpecInput{
		Args: argv, Env: env, Cwd: orDefault(c.spec.WorkingDir, img.WorkingDir), UID: uid, GID: gid, Groups: groups,
		Hostname: hostname, NetNS: w.sandbox.NetNS, HostNetwork: pod.Spec.HostNetwork, ReadOnly: readOnly,
		Privileged: privileged, CapAdd: capAdd, CapDrop: capDrop,
		NoNewPrivs: sc != nil && sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation,
		Mounts:     mounts,
	})
	if err := oci.WriteSpec(bundle, spec); err != nil {
		return nil, waitErr(reasonCreate, err)
	}
	rootfs := filepath.Join(bundle, "rootfs")
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", img.Rootfs, filepath.Join(a.Dir, "upper"), filepath.Join(a.Dir, "work"))
	if err := unix.Mount("overlay", rootfs, "overlay", 0, opts); err != nil {
		return nil, waitErr(reasonCreate, fmt.Errorf("mount the container's root (overlay of %s): %w", img.Rootfs, err))
	}
	shim := oci.ShimArgs{Runc: cfg.Runc, Bundle: bundle, ID: a.ID, Log: w.logPath(c.spec.Name, n), Status: filepath.Join(a.Dir, "status")}
	if err := w.spawnShim(shim, a); err != nil {
		a.StartError = err.Error()
		_ = writeAttempt(a)
		return a, nil
	}
	return a, writeAttempt(a)
}

// spawnShim starts the container's shim in a session of its own and waits for runc's answer.
func (w *worker) spawnShim(s oci.ShimArgs, a *attempt) error {
	shimLog, err := os.OpenFile(filepath.Join(a.Dir, "shim.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer shimLog.Close()
	cmd := exec.Command(w.rt.cfg.Shim, s.Args()...)
	cmd.Stdout, cmd.Stderr = shimLog, shimLog
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start the container's shim: %w", err)
	}
	go func() { _ = cmd.Wait() }() // reap it when it ends while this agent runs
	deadline := time.Now().Add(startTimeout)
	for {
		st, err := oci.ReadStatus(s.Status)
		if err == nil && st.State != "" {
			a.Status = st
			if st.State == oci.StateFailed {
				return errors.New("failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create failed: " + st.Message)
			}
			if st.State != oci.StateCreated {
				return nil
			}
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			return fmt.Errorf("the container did not start within %s (its shim's log: %s)", startTimeout, filepath.Join(a.Dir, "shim.log"))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// cleanAttempt removes an ended run from runc and unmounts its root; its log stays.
func (w *worker) cleanAttempt(ctx context.Context, a *attempt) {
	if a == nil || a.Cleaned {
		return
	}
	if err := deleteWhenStopped(ctx, w.rt.cfg.Runc, a.ID); err != nil {
		klog.ErrorS(err, "delete the container", "pod", klog.KObj(w.pod), "container", a.ID)
	}
	rootfs := filepath.Join(a.Dir, "bundle", "rootfs")
	if err := unix.Unmount(rootfs, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		klog.ErrorS(err, "unmount the container's root", "pod", klog.KObj(w.pod), "container", a.ID)
	}
	for _, d := range []string{"upper", "work", "layers"} {
		_ = os.RemoveAll(filepath.Join(a.Dir, d))
	}
	a.Cleaned = true
	_ = writeAttempt(a)
}

func under(path, dir string) (string, bool) {
	path, dir = filepath.Clean(path), filepath.Clean(dir)
	if !strings.HasPrefix(path, dir+"/") {
		return "", false
	}
	return strings.TrimPrefix(path, dir+"/"), true
}

// makeMountPoint makes path a directory or an empty file, as the mount's source is.
func makeMountPoint(path, source string) {
	if _, err := os.Lstat(path); err == nil {
		return
	}
	_ = os.MkdirAll(filepath.Dir(path), 0o755)
	if st, err := os.Stat(source); err == nil && st.IsDir() {
		_ = os.MkdirAll(path, 0o755)
		return
	}
	if f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
		f.Close()
	}
}

func imageUser(u string) (uint32, uint32) {
	if u == "" {
		return 0, 0
	}
	us, gs, _ := strings.Cut(u, ":")
	uid, _ := strconv.Atoi(us)
	gid, _ := strconv.Atoi(gs)
	return uint32(uid), uint32(gid)
}

func hasOpt(opts []string, o string) bool {
	for _, x := range opts {
		if x == o {
			return true
		}
	}
	return false
}

func orDefault(v, d string) string {
	if v == "" {
		return d
	}
	return v
}

func shortID(uid string) string {
	s := strings.ReplaceAll(uid, "-", "")
	if len(s) > 12 {
		s = s[:12]
	}
	return s
}

func gpuNames(gs []toolkit.GPU) []string {
	out := make([]string, 0, len(gs))
	for _, g := range gs {
		out = append(out, g.UUID)
	}
	return out
}

func sortedEnvKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	for i := 1; i < len(keys); i++ {
		for j := i; j > 0 && keys[j] < keys[j-1]; j-- {
			keys[j], keys[j-1] = keys[j-1], keys[j]
		}
	}
	return keys
}
