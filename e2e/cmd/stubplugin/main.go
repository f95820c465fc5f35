// Command stubplugin runs the kubelet's own stub device plugin (pkg/kubelet/cm/devicemanager/plugin/v1beta1,
// NewDevicePluginStub): it registers --resource with --devices healthy devices on the kubelet socket in
// --plugin-dir, and answers Allocate with one response per container naming its devices in STUB_DEVICES (the
// stub's own default answers with no container at all, which the device manager refuses). It is the floor a
// device plugin's admission cost is compared with.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	plugin "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/plugin/v1beta1"
)

func main() {
	fs := flag.NewFlagSet("stubplugin", flag.ContinueOnError)
	klog.InitFlags(fs)
	resourceName := fs.String("resource", "", "extended resource to register, e.g. example.com/dev (required)")
	count := fs.Int("devices", 0, "how many devices to advertise (required, > 0)")
	pluginDir := fs.String("plugin-dir", "", "the kubelet's device-plugins directory, holding kubelet.sock (required)")
	socketName := fs.String("socket-name", "stub.sock", "the plugin's socket name in --plugin-dir")
	preferred := fs.Bool("preferred", false, "offer GetPreferredAllocation")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if err := check(*resourceName, *count, *pluginDir, *socketName); err != nil {
		fmt.Fprintf(os.Stderr, "stubplugin: %v\n", err)
		os.Exit(2)
	}
	devs := make([]*pluginapi.Device, *count)
	for i := range devs {
		devs[i] = &pluginapi.Device{ID: fmt.Sprintf("dev-%d", i), Health: pluginapi.Healthy}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	logger := klog.Background()
	socket := filepath.Join(*pluginDir, *socketName)
	stub := plugin.NewDevicePluginStub(logger, devs, socket, *resourceName, false, *preferred)
	stub.SetAllocFunc(allocate)
	if err := stub.Start(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "stubplugin: serve %s: %v\n", socket, err)
		os.Exit(1)
	}
	kubeletSock := filepath.Join(*pluginDir, "kubelet.sock")
	if err := stub.Register(ctx, kubeletSock, *resourceName, *pluginDir); err != nil {
		fmt.Fprintf(os.Stderr, "stubplugin: register with %s: %v\n", kubeletSock, err)
		os.Exit(1)
	}
	// Registers again when the kubelet's socket is created anew (a restarted kubelet), as the stub does.
	go stub.Watch(ctx, kubeletSock, *resourceName, *pluginDir)
	fmt.Printf("stubplugin: registered %s with %d devices\n", *resourceName, *count)
	<-ctx.Done()
	_ = stub.Stop(logger)
}

// allocate answers each container request with the IDs it was given.
func allocate(r *pluginapi.AllocateRequest, _ map[string]*pluginapi.Device) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range r.ContainerRequests {
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"STUB_DEVICES": strings.Join(c.DevicesIds, ",")},
		})
	}
	return resp, nil
}

func check(resourceName string, count int, pluginDir, socketName string) error {
	if resourceName == "" || !strings.Contains(resourceName, "/") {
		return errors.New("--resource is required and must be an extended resource name, e.g. --resource example.com/dev")
	}
	if count <= 0 {
		return errors.New("--devices must be a positive count, e.g. --devices 8")
	}
	if pluginDir == "" {
		return errors.New("--plugin-dir is required: the directory holding the kubelet's kubelet.sock")
	}
	if socketName == "" || strings.Contains(socketName, "/") {
		return errors.New("--socket-name must be a plain file name, e.g. stub.sock")
	}
	return nil
}
