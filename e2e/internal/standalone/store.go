// Package standalone is the node's pod source without an apiserver: pods are admitted and ended through the
// control API, and the admitted ones are kept as files under <root>/pods/ (as static pod manifests would be), so
// a restarted node still counts them active and the device manager keeps their devices from its checkpoint.
package standalone

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/gpushare/devplugin/e2e/internal/admission"
	"github.com/gpushare/devplugin/e2e/internal/control"
	"github.com/gpushare/devplugin/e2e/internal/pods"
)

// Source admits and ends pods given by the caller.
type Source struct {
	Dir      string
	Admitter *admission.Admitter
	Table    *pods.Table
}

// New returns the source keeping its pods under <root>/pods.
func New(root string, adm *admission.Admitter, table *pods.Table) (*Source, error) {
	dir := filepath.Join(root, "pods")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("standalone pods directory: %w", err)
	}
	return &Source{Dir: dir, Admitter: adm, Table: table}, nil
}

// Restore adopts the pods admitted before a restart (oldest first), then marks the sources ready.
func (s *Source) Restore(sources *pods.SourcesReady) error {
	entries, err := os.ReadDir(s.Dir)
	if err != nil {
		return err
	}
	var restored []*v1.Pod
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(s.Dir, e.Name()))
		if err != nil {
			return err
		}
		p := &v1.Pod{}
		if err := json.Unmarshal(data, p); err != nil {
			return fmt.Errorf("pod file %s: %w", e.Name(), err)
		}
		restored = append(restored, p)
	}
	sort.SliceStable(restored, func(i, j int) bool {
		return restored[i].CreationTimestamp.Before(&restored[j].CreationTimestamp)
	})
	for _, p := range restored {
		s.Admitter.Adopt(p)
	}
	klog.InfoS("restored the admitted pods", "count", len(restored))
	sources.MarkReady()
	return nil
}

// Validate says what is missing from a pod given to Admit.
func Validate(pod *v1.Pod) error {
	if pod.UID == "" {
		return fmt.Errorf("the pod has no metadata.uid: give each pod a unique uid")
	}
	if pod.Name == "" {
		return fmt.Errorf("the pod has no metadata.name")
	}
	if len(pod.Spec.Containers) == 0 {
		return fmt.Errorf("pod %s has no containers", pod.Name)
	}
	if s := string(pod.UID); filepath.Base(s) != s || s == "." || s == ".." {
		return fmt.Errorf("pod uid %q is not a plain name", s)
	}
	return nil
}

// Admit admits a pod; an admitted pod is written to the source.
func (s *Source) Admit(pod *v1.Pod) (admission.Result, error) {
	if err := Validate(pod); err != nil {
		return admission.Result{}, err
	}
	if pod.Namespace == "" {
		pod.Namespace = "default"
	}
	if s.Table.Known(pod.UID) {
		return admission.Result{}, fmt.Errorf("pod uid %s was given already: give each pod a new uid", pod.UID)
	}
	res := s.Admitter.Admit(pod)
	if res.Admitted {
		data, err := json.Marshal(pod)
		if err != nil {
			return res, err
		}
		if err := os.WriteFile(filepath.Join(s.Dir, string(pod.UID)), data, 0o640); err != nil {
			return res, err
		}
	}
	return res, nil
}

// ErrUnknownPod is returned by End for a uid the node does not hold.
var ErrUnknownPod = control.ErrNotFound

// End ends a pod (its devices are freed) and removes it from the source.
func (s *Source) End(uid types.UID) error {
	pod, ok := s.Table.Get(uid)
	if !ok {
		return ErrUnknownPod
	}
	s.Admitter.End(pod)
	s.Table.Remove(uid)
	if err := os.Remove(filepath.Join(s.Dir, string(uid))); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}
