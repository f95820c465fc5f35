package devices

import (
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
)

// CapacityReader calls the device manager's GetCapacity for whoever asks (the node status loop, the books) and
// keeps the resources it reports gone until the node status loop has published them at 0: GetCapacity reports a
// removed resource once only.
type CapacityReader struct {
	dm      *devicemanager.ManagerImpl
	mu      sync.Mutex
	removed map[string]bool
}

// NewCapacityReader reads dm's capacity.
func NewCapacityReader(dm *devicemanager.ManagerImpl) *CapacityReader {
	return &CapacityReader{dm: dm, removed: map[string]bool{}}
}

// Read returns the device manager's capacity and allocatable now.
func (c *CapacityReader) Read() (capacity, allocatable v1.ResourceList) {
	capacity, allocatable, removed := c.dm.GetCapacity()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range removed {
		c.removed[r] = true
	}
	for r := range capacity {
		delete(c.removed, string(r))
	}
	return capacity, allocatable
}

// TakeRemoved returns the resources gone since the last call.
func (c *CapacityReader) TakeRemoved() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(c.removed))
	for r := range c.removed {
		out = append(out, r)
	}
	c.removed = map[string]bool{}
	return out
}
