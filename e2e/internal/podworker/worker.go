package podworker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/klog/v2"
	podutil "k8s.io/kubernetes/pkg/api/v1/pod"

	"github.com/gpushare/devplugin/e2e/internal/oci"
	"github.com/gpushare/devplugin/e2e/internal/podnet"
	"github.com/gpushare/devplugin/e2e/internal/podsetup"
)

// syncPeriod is how often a worker looks at its containers (their shims record their ends in files).
const syncPeriod = 100 * time.Millisecond

// minGrace is the kubelet's minimumGracePeriodInSeconds: a container gets at least this long after SIGTERM.
const minGrace = 2 * time.Second

// worker is one pod's pod worker.
type worker struct {
	rt  *Runtime
	dir string

	mu      sync.Mutex
	pod     *v1.Pod
	ctrs    []*ctr // init containers, then app containers, in spec order
	updates chan *v1.Pod
	// Termination: requested once (the first grace holds), every requester's done called when it is over.
	term     chan struct{}
	grace    time.Duration
	dones    []func()
	finished bool

	sandbox      podnet.Sandbox
	sandboxReady bool
	sandboxErr   error
	sandboxNext  time.Time
	sandboxWait  time.Duration
	volumes      podsetup.Volumes
	startTime    time.Time
	failedInit   bool // an init container failed with restartPolicy Never: the pod failed
	terminal     v1.PodPhase
	terminalDone bool
	last         *v1.PodStatus
	hostsGen     uint64
	conds        map[v1.PodConditionType]condState
}

func newWorker(r *Runtime, pod *v1.Pod) *worker {
	w := &worker{rt: r, pod: pod, dir: r.podDir(string(pod.UID)), term: make(chan struct{}, 1),
		updates: make(chan *v1.Pod, 16), startTime: time.Now()}
	if pod.Status.StartTime != nil {
		w.startTime = pod.Status.StartTime.Time
	}
	for _, c := range pod.Spec.InitContainers {
		w.ctrs = append(w.ctrs, &ctr{spec: c, init: true, sidecar: podutil.IsRestartableInitContainer(&c)})
	}
	for _, c := range pod.Spec.Containers {
		w.ctrs = append(w.ctrs, &ctr{spec: c})
	}
	w.adopt()
	return w
}

// adopt picks up the runs a node agent before this one started (its pod was admitted and Running).
func (w *worker) adopt() {
	runs := readAttempts(w.dir)
	for _, c := range w.ctrs {
		list := runs[c.spec.Name]
		if len(list) == 0 {
			continue
		}
		c.attempts = list[len(list)-1].N + 1
		c.restarts = int32(len(list) - 1)
		c.cur = list[len(list)-1]
		c.image, c.imageID = c.cur.Image, c.cur.ImageID
		if len(list) > 1 {
			c.last = list[len(list)-2].terminated("")
		}
		if c.init && !c.sidecar && c.cur.ended() && c.cur.exitCode() == 0 {
			c.done = true
		}
	}
	if len(runs) > 0 {
		if sb, err := readSandbox(w.dir); err == nil {
			w.sandbox = sb
		}
	}
}

func (w *worker) update(pod *v1.Pod) {
	select {
	case w.updates <- pod:
	default:
		w.mu.Lock()
		w.pod = pod
		w.mu.Unlock()
	}
}

// terminate asks the worker to stop the pod; done is called once its containers and sandbox are gone (at once
// when that is already so).
func (w *worker) terminate(grace time.Duration, done func()) {
	w.mu.Lock()
	if w.finished {
		w.mu.Unlock()
		go done()
		return
	}
	first := w.dones == nil
	w.dones = append(w.dones, done)
	if first {
		w.grace = max(grace, minGrace)
	}
	w.mu.Unlock()
	if first {
		w.term <- struct{}{}
	}
}

func (w *worker) loop() {
	ctx := context.Background()
	tick := time.NewTicker(syncPeriod)
	defer tick.Stop()
	for {
		select {
		case p := <-w.updates:
			w.mu.Lock()
			w.pod = p
			w.mu.Unlock()
		case <-w.term:
			w.mu.Lock()
			grace := w.grace
			w.mu.Unlock()
			w.stop(ctx, grace, true)
			w.rt.forget(w.pod.UID)
			w.mu.Lock()
			w.finished = true
			dones := w.dones
			w.mu.Unlock()
			for _, d := range dones {
				d()
			}
			return
		case <-tick.C:
		}
		w.sync(ctx)
		w.report()
	}
}

// sync is one pass of the pod worker: sandbox, init containers, app containers, the pod's end.
func (w *worker) sync(ctx context.Context) {
	if w.terminal != "" {
		return
	}
	for _, c := range w.ctrs {
		w.refresh(ctx, c)
	}
	if !w.sandboxReady {
		if time.Now().Before(w.sandboxNext) {
			return
		}
		if err := w.setUpSandbox(ctx); err != nil {
			// the kubelet retries a failed mount with a back-off: 0.5 s, doubled, at most 2 min
			w.sandboxWait = min(max(2*w.sandboxWait, 500*time.Millisecond), 2*time.Minute)
			w.sandboxErr = err
			w.sandboxNext = time.Now().Add(w.sandboxWait)
			klog.InfoS("pod sandbox not ready", "pod", klog.KObj(w.pod), "podUID", w.pod.UID, "retryIn", w.sandboxWait, "err", err)
			return
		}
		w.sandboxReady, w.sandboxErr = true, nil
	}
	w.refreshHosts()
	initsDone := true
	for _, c := range w.ctrs {
		if !c.init {
			continue
		}
		if c.sidecar {
			if !c.cur.running() {
				w.ensure(ctx, c, true)
			}
			if !c.cur.running() {
				initsDone = false
				break
			}
			continue
		}
		if c.done {
			continue
		}
		initsDone = false
		switch {
		case c.cur.running():
		case c.cur.ended() && c.cur.exitCode() == 0 && c.cur.StartError == "":
			c.done, initsDone = true, true
			continue
		case c.cur.ended() && w.pod.Spec.RestartPolicy == v1.RestartPolicyNever:
			w.failedInit = true
		case c.cur.ended():
			w.ensure(ctx, c, true)
		default:
			w.ensure(ctx, c, false)
		}
		break
	}
	if w.failedInit {
		w.finish(ctx, v1.PodFailed)
		return
	}
	if !initsDone {
		return
	}
	for _, c := range w.ctrs {
		switch {
		case c.init && c.sidecar:
			if !c.cur.running() {
				w.ensure(ctx, c, true)
			}
		case c.init:
		case c.cur == nil:
			w.ensure(ctx, c, false)
		case c.cur.ended() && !c.done:
			restart := w.pod.Spec.RestartPolicy == v1.RestartPolicyAlways ||
				(w.pod.Spec.RestartPolicy == v1.RestartPolicyOnFailure && c.cur.exitCode() != 0)
			if restart {
				w.ensure(ctx, c, true)
			} else {
				c.done = true
			}
		}
	}
	if phase := w.phase(); phase == v1.PodSucceeded || phase == v1.PodFailed {
		w.finish(ctx, phase)
	}
}

// refresh reads the shim's record of the container's current run; an ended run is removed from runc.
func (w *worker) refresh(ctx context.Context, c *ctr) {
	a := c.cur
	if a == nil || a.StartError != "" {
		return
	}
	if !a.ended() {
		st, err := oci.ReadStatus(filepath.Join(a.Dir, "status"))
		if err != nil {
			return
		}
		a.Status = st
		if a.running() && !oci.Alive(st.ShimPid) {
			if st2, err := oci.ReadStatus(filepath.Join(a.Dir, "status")); err == nil && st2.State == oci.StateExited {
				a.Status = st2
			} else {
				a.Status.State, a.Status.ExitCode, a.Status.FinishedAt = oci.StateExited, 255, time.Now()
				a.Status.Message = "the container's shim ended without recording the container's exit"
			}
		}
		if a.ended() {
			klog.InfoS("container ended", "pod", klog.KObj(w.pod), "podUID", w.pod.UID, "container", c.spec.Name,
				"exitCode", a.exitCode(), "attempt", a.N)
		}
	}
	if a.ended() && !a.Cleaned {
		w.cleanAttempt(ctx, a)
	}
}

// ensure starts the container unless its back-off holds it; restart says it ran before.
func (w *worker) ensure(ctx context.Context, c *ctr, restart bool) {
	now := time.Now()
	if restart && c.cur != nil && c.cur.ended() && c.next.IsZero() {
		// the kubelet's crash-loop back-off: 10 s, doubled per restart, at most 5 min; reset after 10 min running
		if c.backoff == 0 || (!c.cur.Status.StartedAt.IsZero() && c.cur.Status.FinishedAt.Sub(c.cur.Status.StartedAt) > 10*time.Minute) {
			c.backoff = w.rt.cfg.BackoffInitial
		} else {
			c.backoff *= 2
			if c.backoff > w.rt.cfg.BackoffMax {
				c.backoff = w.rt.cfg.BackoffMax
			}
		}
		c.next = now.Add(c.backoff)
		if c.restarts > 0 || c.attempts > 0 {
			c.wait = &waiting{Reason: reasonCrashLoop, Message: fmt.Sprintf("back-off %s restarting failed container=%s pod=%s_%s(%s)",
				c.backoff, c.spec.Name, w.pod.Name, w.pod.Namespace, w.pod.UID)}
		}
	}
	if now.Before(c.next) {
		return
	}
	prev := c.cur
	a, err := w.launch(ctx, c)
	if err != nil {
		var sf *startFailure
		if errors.As(err, &sf) && sf.wait != nil {
			if sf.wait.Reason == reasonPull && c.wait != nil && (c.wait.Reason == reasonPull || c.wait.Reason == reasonPullBackOff) {
				sf.wait.Reason = reasonPullBackOff
				sf.wait.Message = fmt.Sprintf("Back-off pulling image %q: %s", c.spec.Image, sf.wait.Message)
			}
			c.wait = sf.wait
		} else {
			c.wait = &waiting{Reason: reasonCreate, Message: err.Error()}
		}
		if c.backoff == 0 {
			c.backoff = w.rt.cfg.BackoffInitial
		}
		c.next = now.Add(c.backoff)
		klog.InfoS("container not started", "pod", klog.KObj(w.pod), "podUID", w.pod.UID, "container", c.spec.Name,
			"reason", c.wait.Reason, "message", c.wait.Message)
		return
	}
	if prev != nil && prev.ended() {
		c.last = prev.terminated(w.terminationMessage(c, prev))
		c.restarts++
	}
	c.cur, c.wait, c.next = a, nil, time.Time{}
	if a.StartError != "" {
		klog.InfoS("container failed to start", "pod", klog.KObj(w.pod), "podUID", w.pod.UID, "container", c.spec.Name, "err", a.StartError)
		return
	}
	klog.V(2).InfoS("container started", "pod", klog.KObj(w.pod), "podUID", w.pod.UID, "container", c.spec.Name, "id", a.ID)
}

// finish is the pod's end (Succeeded or Failed): the containers still running (sidecars) are stopped, the sandbox
// torn down, and the pod reported terminal, so that its devices are freed.
func (w *worker) finish(ctx context.Context, phase v1.PodPhase) {
	w.terminal = phase
	w.stop(ctx, w.specGrace(), false)
	w.report()
	klog.InfoS("pod finished", "pod", klog.KObj(w.pod), "podUID", w.pod.UID, "phase", phase)
}

func (w *worker) specGrace() time.Duration {
	if g := w.pod.Spec.TerminationGracePeriodSeconds; g != nil {
		return time.Duration(*g) * time.Second
	}
	return 30 * time.Second
}

// stop ends every running container (SIGTERM, SIGKILL after grace; sidecars after the app containers, as the
// kubelet orders them), removes them and the sandbox, and reports the pod terminal once.
func (w *worker) stop(ctx context.Context, grace time.Duration, deleting bool) {
	var apps, sidecars []*ctr
	for _, c := range w.ctrs {
		if c.cur.running() {
			if c.init {
				sidecars = append(sidecars, c)
			} else {
				apps = append(apps, c)
			}
		}
	}
	deadline := time.Now().Add(grace)
	w.kill(ctx, apps, deadline)
	w.kill(ctx, sidecars, deadline)
	for _, c := range w.ctrs {
		w.refresh(ctx, c)
		if c.cur != nil && !c.cur.Cleaned {
			w.cleanAttempt(ctx, c.cur)
		}
	}
	if w.sandboxReady || w.sandbox.Name != "" || deleting {
		w.tearDownSandbox(ctx)
	}
	if w.terminal == "" {
		w.terminal = w.phase()
		if w.terminal != v1.PodSucceeded {
			w.terminal = v1.PodFailed
		}
		if deleting && w.terminal == v1.PodFailed && w.allZero() {
			w.terminal = v1.PodSucceeded
		}
	}
	if !w.terminalDone {
		w.terminalDone = true
		if w.rt.cfg.Terminal != nil {
			w.rt.cfg.Terminal(w.pod, w.terminal)
		}
	}
	if deleting {
		w.report()
		os.RemoveAll(w.dir)
	}
}

func (w *worker) allZero() bool {
	for _, c := range w.ctrs {
		if !c.init && (c.cur == nil || c.cur.exitCode() != 0) {
			return false
		}
	}
	return true
}

// kill sends SIGTERM to each container, waits for them until deadline, then SIGKILLs what is left.
func (w *worker) kill(ctx context.Context, cs []*ctr, deadline time.Time) {
	if len(cs) == 0 {
		return
	}
	for _, c := range cs {
		if err := w.rt.cfg.Runc.Kill(ctx, c.cur.ID, syscall.SIGTERM, false); err != nil {
			klog.ErrorS(err, "SIGTERM the container", "pod", klog.KObj(w.pod), "container", c.spec.Name)
		}
	}
	killed := false
	for {
		all := true
		for _, c := range cs {
			w.refresh(ctx, c)
			if c.cur.running() {
				all = false
			}
		}
		if all {
			return
		}
		if !killed && time.Now().After(deadline) {
			killed = true
			for _, c := range cs {
				if c.cur.running() {
					klog.InfoS("container did not stop within its grace period: SIGKILL", "pod", klog.KObj(w.pod), "container", c.spec.Name)
					_ = w.rt.cfg.Runc.Kill(ctx, c.cur.ID, syscall.SIGKILL, true)
				}
			}
		}
		if killed && time.Now().After(deadline.Add(30*time.Second)) {
			for _, c := range cs {
				if c.cur.running() {
					klog.ErrorS(nil, "container still runs 30 s after SIGKILL", "pod", klog.KObj(w.pod), "container", c.spec.Name)
				}
			}
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// runningID is the runc id of the container's current run, if it runs.
func (w *worker) runningID(container string) (string, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, c := range w.ctrs {
		if c.spec.Name == container {
			if c.cur.running() {
				return c.cur.ID, nil
			}
			return "", fmt.Errorf("container %s is not running", container)
		}
	}
	return "", fmt.Errorf("the pod has no container %q", container)
}

func (w *worker) logs(container string, previous bool) ([]byte, error) {
	return logsFromDisk(w.dir, container, previous)
}

func (w *worker) logDir(container string) string { return filepath.Join(w.dir, "logs", container) }

func (w *worker) logPath(container string, n int) string {
	return filepath.Join(w.logDir(container), fmt.Sprintf("%d.log", n))
}

// terminationMessage is what the container wrote to its termination-message path, or with
// FallbackToLogsOnError and a failure, the end of its log.
func (w *worker) terminationMessage(c *ctr, a *attempt) string {
	data, _ := os.ReadFile(filepath.Join(a.Dir, "termination-log"))
	if len(data) > 4096 {
		data = data[:4096]
	}
	msg := string(data)
	if msg == "" && c.spec.TerminationMessagePolicy == v1.TerminationMessageFallbackToLogsOnError && a.exitCode() != 0 {
		log, _ := os.ReadFile(w.logPath(c.spec.Name, a.N))
		lines := strings.Split(strings.TrimRight(string(log), "\n"), "\n")
		if len(lines) > 80 {
			lines = lines[len(lines)-80:]
		}
		msg = strings.Join(lines, "\n")
		if len(msg) > 2048 {
			msg = msg[len(msg)-2048:]
		}
	}
	return msg
}

// report hands the pod's status to the status manager when it changed.
func (w *worker) report() {
	st := w.status()
	if w.last != nil && equality.Semantic.DeepEqual(*w.last, st) {
		return
	}
	w.last = &st
	if w.rt.cfg.Status != nil {
		w.rt.cfg.Status(w.pod, st)
	}
}
