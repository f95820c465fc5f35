// Package control is the node's control HTTP API: thin handlers over the functions that admit and end pods and
// read the device manager's books.
//
//	GET  /healthz  -> "ok"
//	GET  /books    -> the device manager's books (devices.Books); on DRA nodes each container also lists its CDI
//	                  devices and what they injected
//	GET  /claims   -> the claims the DRA manager holds prepared (dra.Claim list; nodes with an apiserver only)
//	GET  /drivers/{name} -> {"registered": bool}: whether that DRA driver is registered with the DRA manager
//	POST /admit    -> body: a v1.Pod (metadata.uid set); answer {"admitted","reason","message","seconds"} once admitted or
//	                  rejected (standalone nodes only)
//	POST /end      -> body: {"uid": "..."}; the pod ends and its devices are freed
//	POST /exec     -> body: {"namespace", "pod", "container", "command": [...], "stdin"?, "timeoutSeconds"?}; answer
//	                  {"exitCode", "stdout", "stderr", "error"?} once the command ended (--runtime runc)
//	GET  /logs/{namespace}/{pod}/{container}[?previous=true] -> the container's output (--runtime runc)
package control

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpushare/devplugin/e2e/internal/admission"
	"github.com/gpushare/devplugin/e2e/internal/devices"
	"github.com/gpushare/devplugin/e2e/internal/dra"
	"github.com/gpushare/devplugin/e2e/internal/oci"
)

// ErrNotFound is what End returns for a uid the node does not hold.
var ErrNotFound = errors.New("no pod of this uid on the node")

// API is what the handlers call.
type API struct {
	Books func() devices.Books
	// Admit is nil on a node that takes its pods from an apiserver.
	Admit func(pod *v1.Pod) (admission.Result, error)
	End   func(uid types.UID) error
	// Claims is nil on a node without the DRA manager (--standalone).
	Claims func() ([]dra.Claim, error)
	// Registered is nil on a node without the DRA manager.
	Registered func(driver string) bool
	// Exec and Logs are nil on a node that runs no containers.
	Exec func(ns, name, container string, cmd []string, stdin []byte, timeout time.Duration) (oci.ExecResult, error)
	Logs func(ns, name, container string, previous bool) ([]byte, error)
}

const maxBody = 4 << 20

// Handler routes the control API.
func Handler(api API) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /books", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, api.Books())
	})
	mux.HandleFunc("GET /claims", func(w http.ResponseWriter, _ *http.Request) {
		if api.Claims == nil {
			httpError(w, http.StatusConflict, "this node runs no DRA manager (--standalone): start it with --kubeconfig")
			return
		}
		claims, err := api.Claims()
		if err != nil {
			httpError(w, http.StatusInternalServerError, err.Error())
			return
		}
		writeJSON(w, http.StatusOK, claims)
	})
	mux.HandleFunc("GET /drivers/{name}", func(w http.ResponseWriter, r *http.Request) {
		if api.Registered == nil {
			httpError(w, http.StatusConflict, "this node runs no DRA manager (--standalone): start it with --kubeconfig")
			return
		}
		writeJSON(w, http.StatusOK, map[string]bool{"registered": api.Registered(r.PathValue("name"))})
	})
	mux.HandleFunc("POST /admit", func(w http.ResponseWriter, r *http.Request) {
		if api.Admit == nil {
			httpError(w, http.StatusConflict, "this node takes its pods from the apiserver: create the pod there, or start the node with --standalone")
			return
		}
		pod := &v1.Pod{}
		if err := decode(r, pod); err != nil {
			httpError(w, http.StatusBadRequest, "the body is not a v1.Pod in JSON: "+err.Error())
			return
		}
		res, err := api.Admit(pod)
		if err != nil {
			httpError(w, http.StatusBadRequest, err.Error())
			return
		}
		writeJSON(w, http.StatusOK, res)
	})
	mux.HandleFunc("POST /exec", func(w http.ResponseWriter, r *http.Request) {
		if api.Exec == nil {
			httpError(w, http.StatusConflict, "this node runs no containers (start it with --runtime runc)")
			return
		}
		var body struct {
			Namespace      string   `json:"namespace"`
			Pod            string   `json:"pod"`
			Container      string   `json:"container"`
			Command        []string `json:"command"`
			Stdin          *string  `json:"stdin"`
			TimeoutSeconds float64  `json:"timeoutSeconds"`
		}
		if err := decode(r, &body); err != nil || body.Pod == "" || body.Container == "" || len(body.Command) == 0 {
			httpError(w, http.StatusBadRequest, `the body must be {"namespace", "pod", "container", "command": [...], "stdin"?, "timeoutSeconds"?}`)
			return
		}
		timeout := time.Duration(body.TimeoutSeconds * float64(time.Second))
		if timeout <= 0 {
			timeout = 60 * time.Second
		}
		var stdin []byte
		if body.Stdin != nil {
			stdin = []byte(*body.Stdin)
		}
		res, err := api.Exec(body.Namespace, body.Pod, body.Container, body.Command, stdin, timeout)
		if errors.Is(err, ErrNotFound) {
			httpError(w, http.StatusNotFound, fmt.Sprintf("no pod %s/%s on this node", body.Namespace, body.Pod))
			return
		}
		if err != nil {
			httpError(w, http.StatusConflict, err.Error())
			return
		}
		writeJSON(w, http.StatusOK, res)
	})
	mux.HandleFunc("GET /logs/{namespace}/{pod}/{container}", func(w http.ResponseWriter, r *http.Request) {
		if api.Logs == nil {
			httpError(w, http.StatusConflict, "this node runs no containers (start it with --runtime runc)")
			return
		}
		data, err := api.Logs(r.PathValue("namespace"), r.PathValue("pod"), r.PathValue("container"), r.URL.Query().Get("previous") == "true")
		if errors.Is(err, ErrNotFound) {
			httpError(w, http.StatusNotFound, fmt.Sprintf("no pod %s/%s on this node", r.PathValue("namespace"), r.PathValue("pod")))
			return
		}
		if err != nil {
			httpError(w, http.StatusNotFound, err.Error())
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write(data)
	})
	mux.HandleFunc("POST /end", func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			UID string `json:"uid"`
		}
		if err := decode(r, &body); err != nil || body.UID == "" {
			httpError(w, http.StatusBadRequest, `the body must be {"uid": "<pod uid>"}`)
			return
		}
		err := api.End(types.UID(body.UID))
		if errors.Is(err, ErrNotFound) {
			httpError(w, http.StatusNotFound, fmt.Sprintf("no pod of uid %s on this node", body.UID))
			return
		}
		if err != nil {
			httpError(w, http.StatusInternalServerError, err.Error())
			return
		}
		writeJSON(w, http.StatusOK, map[string]bool{"ended": true})
	})
	return mux
}

func decode(r *http.Request, into any) error {
	return json.NewDecoder(io.LimitReader(r.Body, maxBody)).Decode(into)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func httpError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]string{"error": msg})
}
