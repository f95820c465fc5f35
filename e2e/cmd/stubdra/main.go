// Command stubdra is a minimal DRA kubelet plugin built on Kubernetes' own helper for DRA drivers
// (k8s.io/dynamic-resource-allocation/kubeletplugin, the code upstream's example and test drivers use): it
// registers with the kubelet's plugin watcher in --plugins-registry-dir (GetInfo: type DRAPlugin, the driver
// name, its DRA socket in --plugin-dir, v1.DRAPlugin), serves the DRA v1 API, and publishes the node's
// ResourceSlice (pool = node name): --gpus devices gpu-0, gpu-1, ... (attributes index and type=share, what the
// shipped DeviceClass gpu.gpushare.io selects), each shared by several allocations
// (allowMultipleAllocations) with the consumable capacities memory (--gpu-memory; request policy: default 1Gi,
// 256Mi to the full value in steps of 256Mi) and cores (100; default 100, 5 to 100 in steps of 5). The helper's
// slice controller publishes the slice again when it is deleted (the kubelet deletes a node's slices when it
// starts, until the drivers register again).
//
// NodePrepareResources writes, per claim, one CDI spec into --cdi-dir with one device per allocation result
// (kind gpu.gpushare.io/claim, device <claim UID>-<result index>): env GPUSHARE_DRA_DEVICE, GPUSHARE_DRA_SHARE_ID,
// GPUSHARE_DRA_MEMORY (bytes consumed), GPUSHARE_DRA_CORES, GPUSHARE_DRA_CLAIM (namespace/name), and a mount of
// a per-claim file under --plugin-dir at /etc/gpushare-dra/<result index>. NodeUnprepareResources removes both.
// It is the floor the project's own DRA plugin (`devplugin dra`) is checked beside in the harness.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

type options struct {
	driver, node, kubeconfig, registryDir, pluginDir, cdiDir string
	gpus                                                     int
	memory                                                   resource.Quantity
}

func main() {
	fs := flag.NewFlagSet("stubdra", flag.ContinueOnError)
	klog.InitFlags(fs)
	var o options
	var memory string
	fs.StringVar(&o.driver, "driver", "gpu.gpushare.io", "the driver name")
	fs.StringVar(&o.node, "node-name", "", "the node's name: the pool and the slice's nodeName (required)")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig for publishing the ResourceSlice (required)")
	fs.StringVar(&o.registryDir, "plugins-registry-dir", "", "the kubelet's plugins-registry directory (required)")
	fs.StringVar(&o.pluginDir, "plugin-dir", "", "the plugin's own directory: its DRA socket and per-claim files (required)")
	fs.StringVar(&o.cdiDir, "cdi-dir", "", "where the CDI specs are written (required)")
	fs.IntVar(&o.gpus, "gpus", 2, "how many devices to publish")
	fs.StringVar(&memory, "gpu-memory", "16Gi", "each device's memory capacity")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	var err error
	if o.memory, err = resource.ParseQuantity(memory); err != nil {
		fmt.Fprintf(os.Stderr, "stubdra: --gpu-memory %q is not a quantity, e.g. 16Gi\n", memory)
		os.Exit(2)
	}
	if err := run(o); err != nil {
		fmt.Fprintf(os.Stderr, "stubdra: %v\n", err)
		os.Exit(1)
	}
}

func run(o options) error {
	for name, v := range map[string]string{"--node-name": o.node, "--kubeconfig": o.kubeconfig, "--plugins-registry-dir": o.registryDir, "--plugin-dir": o.pluginDir, "--cdi-dir": o.cdiDir} {
		if v == "" {
			return fmt.Errorf("%s is required", name)
		}
	}
	if o.gpus <= 0 {
		return errors.New("--gpus must be at least 1")
	}
	for _, d := range []string{o.registryDir, o.pluginDir, o.cdiDir} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return err
		}
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return fmt.Errorf("--kubeconfig %s: %w", o.kubeconfig, err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	d := &driver{o: o}
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.DriverName(o.driver), kubeletplugin.NodeName(o.node), kubeletplugin.KubeClient(client),
		kubeletplugin.RegistrarDirectoryPath(o.registryDir), kubeletplugin.PluginDataDirectoryPath(o.pluginDir))
	if err != nil {
		return fmt.Errorf("start the plugin: %w", err)
	}
	defer helper.Stop()
	if err := helper.PublishResources(ctx, resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		o.node: {Slices: []resourceslice.Slice{{Devices: d.devices()}}},
	}}); err != nil {
		return fmt.Errorf("publish the ResourceSlice: %w", err)
	}
	fmt.Printf("stubdra: serving %s on node %s with %d devices\n", o.driver, o.node, o.gpus)
	<-ctx.Done()
	return nil
}

type driver struct{ o options }

func (d *driver) devices() []resourceapi.Device {
	step := resource.MustParse("256Mi")
	coresStep := resource.MustParse("5")
	out := make([]resourceapi.Device, d.o.gpus)
	for i := range out {
		out[i] = resourceapi.Device{
			Name:                     fmt.Sprintf("gpu-%d", i),
			AllowMultipleAllocations: ptr.To(true),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"index": {IntValue: ptr.To(int64(i))},
				"type":  {StringValue: ptr.To("share")}, // what the shipped DeviceClass gpu.gpushare.io selects
			},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				"memory": {Value: d.o.memory, RequestPolicy: &resourceapi.CapacityRequestPolicy{
					Default:    ptr.To(resource.MustParse("1Gi")),
					ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: ptr.To(step), Max: ptr.To(d.o.memory), Step: ptr.To(step)},
				}},
				"cores": {Value: resource.MustParse("100"), RequestPolicy: &resourceapi.CapacityRequestPolicy{
					Default:    ptr.To(resource.MustParse("100")),
					ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: ptr.To(coresStep), Max: ptr.To(resource.MustParse("100")), Step: ptr.To(coresStep)},
				}},
			},
		}
	}
	return out
}

const cdiKind = "gpu.gpushare.io/claim"

func (d *driver) specPath(uid types.UID) string {
	return filepath.Join(d.o.cdiDir, "stubdra-"+string(uid)+".json")
}

func (d *driver) claimDir(uid types.UID) string {
	return filepath.Join(d.o.pluginDir, "claims", string(uid))
}

// PrepareResourceClaims writes each claim's CDI spec (and the file it mounts) and names its CDI devices.
func (d *driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, c := range claims {
		out[c.UID] = d.prepare(c)
		klog.FromContext(ctx).Info("prepared", "claim", klog.KObj(c), "claimUID", c.UID, "err", out[c.UID].Err)
	}
	return out, nil
}

type cdiSpec struct {
	CDIVersion string      `json:"cdiVersion"`
	Kind       string      `json:"kind"`
	Devices    []cdiDevice `json:"devices"`
}

type cdiDevice struct {
	Name           string `json:"name"`
	ContainerEdits struct {
		Env    []string         `json:"env"`
		Mounts []map[string]any `json:"mounts"`
	} `json:"containerEdits"`
}

func (d *driver) prepare(c *resourceapi.ResourceClaim) kubeletplugin.PrepareResult {
	if c.Status.Allocation == nil {
		return kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s is not allocated", c.Namespace, c.Name)}
	}
	spec := cdiSpec{CDIVersion: "0.6.0", Kind: cdiKind}
	var res kubeletplugin.PrepareResult
	dir := d.claimDir(c.UID)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return kubeletplugin.PrepareResult{Err: err}
	}
	for i, r := range c.Status.Allocation.Devices.Results {
		if r.Driver != d.o.driver {
			continue
		}
		name := fmt.Sprintf("%s-%d", c.UID, i)
		var dev cdiDevice
		dev.Name = name
		share := ""
		if r.ShareID != nil {
			share = string(*r.ShareID)
		}
		mem, cores := r.ConsumedCapacity["memory"], r.ConsumedCapacity["cores"]
		dev.ContainerEdits.Env = []string{
			"GPUSHARE_DRA_DEVICE=" + r.Device, "GPUSHARE_DRA_SHARE_ID=" + share,
			fmt.Sprintf("GPUSHARE_DRA_MEMORY=%d", mem.Value()), fmt.Sprintf("GPUSHARE_DRA_CORES=%d", cores.Value()),
			"GPUSHARE_DRA_CLAIM=" + c.Namespace + "/" + c.Name,
		}
		file := filepath.Join(dir, fmt.Sprintf("%d", i))
		if err := os.WriteFile(file, []byte(r.Device+"\n"), 0o640); err != nil {
			return kubeletplugin.PrepareResult{Err: err}
		}
		dev.ContainerEdits.Mounts = []map[string]any{{"hostPath": file, "containerPath": fmt.Sprintf("/etc/gpushare-dra/%d", i), "options": []string{"ro", "bind"}}}
		spec.Devices = append(spec.Devices, dev)
		res.Devices = append(res.Devices, kubeletplugin.Device{
			Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device, CDIDeviceIDs: []string{cdiKind + "=" + name},
			ShareID: r.ShareID,
		})
	}
	data, err := json.Marshal(spec)
	if err != nil {
		return kubeletplugin.PrepareResult{Err: err}
	}
	tmp := d.specPath(c.UID) + ".tmp"
	if err := os.WriteFile(tmp, data, 0o640); err != nil {
		return kubeletplugin.PrepareResult{Err: err}
	}
	if err := os.Rename(tmp, d.specPath(c.UID)); err != nil {
		return kubeletplugin.PrepareResult{Err: err}
	}
	return res
}

// UnprepareResourceClaims removes each claim's CDI spec and files; a claim not prepared is no error.
func (d *driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := map[types.UID]error{}
	for _, c := range claims {
		err := os.Remove(d.specPath(c.UID))
		if errors.Is(err, os.ErrNotExist) {
			err = nil
		}
		if err == nil {
			err = os.RemoveAll(d.claimDir(c.UID))
		}
		out[c.UID] = err
		klog.FromContext(ctx).Info("unprepared", "claim", c.NamespacedName, "claimUID", c.UID, "err", err)
	}
	return out, nil
}

// HandleError logs background errors (publishing the slice); the helper retries what can be retried.
func (d *driver) HandleError(ctx context.Context, err error, msg string) {
	klog.FromContext(ctx).Error(err, msg)
}
