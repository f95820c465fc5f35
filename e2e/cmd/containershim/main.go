// Command containershim is one container's shim (e2e/internal/oci.RunShim): it creates and starts the container
// with runc, stays its parent (the subreaper of its init process) and records its exit, in a session of its own so
// that the container outlives a restart of the node agent that started it. A binary of its own, small: one runs
// beside every container.
//
//	containershim --runc PATH --runc-root DIR --bundle DIR --id ID --log FILE --status FILE
package main

import (
	"fmt"
	"os"

	"github.com/gpushare/devplugin/e2e/internal/oci"
)

func main() {
	a, err := oci.ParseShimArgs(os.Args[1:])
	if err != nil {
		fmt.Fprintf(os.Stderr, "containershim: %v\n", err)
		os.Exit(2)
	}
	if err := oci.RunShim(a); err != nil {
		fmt.Fprintf(os.Stderr, "containershim: %v\n", err)
		os.Exit(1)
	}
}
