package dra

import (
	"fmt"
	"sort"

	"k8s.io/kubernetes/pkg/kubelet/cm/dra/state"
)

// Device is one prepared device of a claim, as the DRA manager recorded the driver's answer.
type Device struct {
	Driver       string   `json:"driver"`
	Pool         string   `json:"pool"`
	Device       string   `json:"device"`
	ShareID      string   `json:"shareID,omitempty"`
	RequestNames []string `json:"requestNames"`
	CDIDeviceIDs []string `json:"cdiDeviceIDs"`
}

// Claim is one ResourceClaim the DRA manager holds prepared: which pods of the node use it, and its devices.
type Claim struct {
	Namespace string   `json:"namespace"`
	Name      string   `json:"name"`
	UID       string   `json:"uid"`
	PodUIDs   []string `json:"podUIDs"`
	Devices   []Device `json:"devices"`
}

// Claims reads the DRA manager's checkpoint (written after every prepare and unprepare): the claims it holds
// prepared, sorted by namespace and name.
func (n *Node) Claims() ([]Claim, error) {
	cp, err := state.NewCheckpointer(n.StateDir, CheckpointName)
	if err != nil {
		return nil, err
	}
	c, err := cp.GetOrCreate()
	if err != nil {
		return nil, fmt.Errorf("read the DRA manager's checkpoint: %w", err)
	}
	list, err := c.GetClaimInfoStateList()
	if err != nil {
		return nil, fmt.Errorf("decode the DRA manager's checkpoint: %w", err)
	}
	out := []Claim{}
	for _, s := range list {
		cl := Claim{Namespace: s.Namespace, Name: s.ClaimName, UID: string(s.ClaimUID), PodUIDs: s.PodUIDs.UnsortedList(), Devices: []Device{}}
		sort.Strings(cl.PodUIDs)
		for driver, ds := range s.DriverState {
			for _, d := range ds.Devices {
				dev := Device{Driver: driver, Pool: d.PoolName, Device: d.DeviceName, RequestNames: d.RequestNames, CDIDeviceIDs: d.CDIDeviceIDs}
				if d.ShareID != nil {
					dev.ShareID = string(*d.ShareID)
				}
				cl.Devices = append(cl.Devices, dev)
			}
		}
		sort.Slice(cl.Devices, func(i, j int) bool {
			a, b := cl.Devices[i], cl.Devices[j]
			return a.Driver+"/"+a.Pool+"/"+a.Device+"/"+a.ShareID < b.Driver+"/"+b.Pool+"/"+b.Device+"/"+b.ShareID
		})
		out = append(out, cl)
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].Namespace+"/"+out[i].Name < out[j].Namespace+"/"+out[j].Name
	})
	return out, nil
}
