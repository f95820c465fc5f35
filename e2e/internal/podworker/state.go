package podworker

import (
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/gpushare/devplugin/e2e/internal/oci"
)

// attempt is one run of a container: its runc container, directory and what its shim recorded.
type attempt struct {
	N       int            `json:"attempt"`
	ID      string         `json:"id"`
	Dir     string         `json:"dir"`
	Image   string         `json:"image"`
	ImageID string         `json:"imageID"`
	Status  oci.ShimStatus `json:"status"`
	// StartError is set when the runtime could not start it at all (the toolkit refused a device, runc create
	// failed): it counts as a run that ended with exit code 128, as containerd reports a StartError.
	StartError string `json:"startError,omitempty"`
	Cleaned    bool   `json:"cleaned,omitempty"`
}

func (a *attempt) running() bool {
	return a != nil && a.StartError == "" && (a.Status.State == oci.StateRunning || a.Status.State == oci.StateCreated)
}

func (a *attempt) ended() bool {
	return a != nil && (a.StartError != "" || a.Status.State == oci.StateExited || a.Status.State == oci.StateFailed)
}

func (a *attempt) exitCode() int32 {
	if a.StartError != "" || a.Status.State == oci.StateFailed {
		return 128
	}
	return int32(a.Status.ExitCode)
}

// terminated is the kubelet's ContainerStateTerminated of an ended attempt.
func (a *attempt) terminated(message string) *v1.ContainerStateTerminated {
	t := &v1.ContainerStateTerminated{ExitCode: a.exitCode(), ContainerID: "runc://" + a.ID}
	switch {
	case a.StartError != "" || a.Status.State == oci.StateFailed:
		t.Reason = "StartError"
		t.Message = a.StartError
		if t.Message == "" {
			t.Message = "failed to create containerd task: failed to create shim task: OCI runtime create failed: " + a.Status.Message
		}
	case a.Status.ExitCode == 0:
		t.Reason = "Completed"
	default:
		t.Reason = "Error"
	}
	if message != "" && t.Message == "" {
		t.Message = message
	}
	t.Signal = int32(a.Status.Signal)
	if !a.Status.StartedAt.IsZero() {
		t.StartedAt.Time = a.Status.StartedAt
	}
	if !a.Status.FinishedAt.IsZero() {
		t.FinishedAt.Time = a.Status.FinishedAt
	} else {
		t.FinishedAt.Time = time.Now()
	}
	return t
}

// waiting is why a container is not running now.
type waiting struct {
	Reason, Message string
}

// ctr is one container of the pod, across its runs.
type ctr struct {
	spec     v1.Container
	init     bool
	sidecar  bool // an init container with restartPolicy Always
	cur      *attempt
	last     *v1.ContainerStateTerminated // the run before cur (lastState)
	restarts int32
	attempts int
	wait     *waiting
	next     time.Time     // back-off: not started again before
	backoff  time.Duration // the current back-off
	done     bool          // an init container that completed, or an app container that will not run again
	image    string
	imageID  string
}
