// Command serviceproxy is the test cluster's Service proxy (e2e/internal/svcproxy): every Service's ClusterIP
// ports, served inside the pod network's bridge namespace and forwarded to the Service's ready endpoints; the
// default/kubernetes Service to the apiserver.
//
//	serviceproxy --kubeconfig FILE --netns NAME --apiserver 127.0.0.1:PORT [--expose NS/NAME:PORT=127.0.0.1:P ...]
//
// It prints `serviceproxy: serving` once its caches are synced.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/gpushare/devplugin/e2e/internal/svcproxy"
)

// exposeFlags is the repeatable --expose flag.
type exposeFlags map[string]string

func (e *exposeFlags) String() string { return fmt.Sprint(map[string]string(*e)) }

func (e *exposeFlags) Set(v string) error {
	svc, host, ok := strings.Cut(v, "=")
	if !ok || !strings.Contains(svc, "/") || !strings.Contains(svc, ":") || !strings.HasPrefix(host, "127.") {
		return fmt.Errorf("%q is not NAMESPACE/NAME:PORT=127.0.0.1:HOSTPORT", v)
	}
	if *e == nil {
		*e = exposeFlags{}
	}
	(*e)[svc] = host
	return nil
}

func main() {
	fs := flag.NewFlagSet("serviceproxy", flag.ExitOnError)
	klog.InitFlags(fs)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the apiserver (required)")
	netns := fs.String("netns", "", "the pod network's bridge namespace, a name under /run/netns (required)")
	apiserver := fs.String("apiserver", "", "host:port the default/kubernetes Service leads to (required)")
	var expose exposeFlags
	fs.Var(&expose, "expose", "NAMESPACE/NAME:PORT=127.0.0.1:HOSTPORT: also serve that Service port on the node's loopback (repeatable)")
	_ = fs.Parse(os.Args[1:])
	if *kubeconfig == "" || *netns == "" || *apiserver == "" {
		fmt.Fprintln(os.Stderr, "serviceproxy: --kubeconfig, --netns and --apiserver are required")
		os.Exit(2)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintf(os.Stderr, "serviceproxy: --kubeconfig %s: %v\n", *kubeconfig, err)
		os.Exit(2)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "serviceproxy: %v\n", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	p := &svcproxy.Proxy{Client: client, NetNSPath: "/run/netns/" + *netns, APIServer: *apiserver,
		Ready: func() { fmt.Println("serviceproxy: serving") }, Exposed: expose}
	if err := p.Run(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "serviceproxy: %v\n", err)
		os.Exit(1)
	}
}
