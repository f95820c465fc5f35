package pods

import "sync/atomic"

// SourcesReady is the kubelet's sources-ready signal: false until the node's pods have been read once (from the
// apiserver, or at once without one). The device manager frees nothing before it is ready.
type SourcesReady struct{ ready atomic.Bool }

// AddSource is part of config.SourcesReady; the node has a single source.
func (s *SourcesReady) AddSource(string) {}

// AllReady reports whether the pods have been read.
func (s *SourcesReady) AllReady() bool { return s.ready.Load() }

// MarkReady is called once the pods have been read.
func (s *SourcesReady) MarkReady() { s.ready.Store(true) }
