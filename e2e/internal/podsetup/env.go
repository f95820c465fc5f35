// Package podsetup does what the kubelet does for a container before the runtime creates it: its environment
// (makeEnvironmentVariables: the master Service's variables, envFrom, env with $(VAR) expansion and valueFrom)
// and its pod's volumes (emptyDir, configMap, secret, projected service-account tokens, downwardAPI, hostPath).
package podsetup

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/kubernetes/pkg/api/v1/resource"
	"k8s.io/kubernetes/pkg/fieldpath"
	"k8s.io/kubernetes/third_party/forked/golang/expansion"
)

// ConfigError is an env or volume the kubelet cannot build (a missing ConfigMap, Secret or key): the container
// waits with reason CreateContainerConfigError.
type ConfigError struct{ Msg string }

func (e *ConfigError) Error() string { return e.Msg }

// Pod is what the env and volumes read of a pod beyond its spec.
type Pod struct {
	Pod    *v1.Pod
	PodIP  string
	HostIP string
}

// Env is the container's environment as the kubelet hands it to the runtime, in order (later entries of a name win).
func Env(ctx context.Context, client kubernetes.Interface, p Pod, c *v1.Container) ([]string, error) {
	pod := p.Pod
	vars := map[string]string{}
	var order []string
	set := func(k, v string) {
		if _, ok := vars[k]; !ok {
			order = append(order, k)
		}
		vars[k] = v
	}
	// The master Service's variables, added whatever enableServiceLinks says (getServiceEnvVarMap).
	if client != nil {
		if svc, err := client.CoreV1().Services(metav1.NamespaceDefault).Get(ctx, "kubernetes", metav1.GetOptions{}); err == nil {
			for _, kv := range serviceEnv(svc) {
				set(kv[0], kv[1])
			}
		}
	}
	cms := map[string]*v1.ConfigMap{}
	secrets := map[string]*v1.Secret{}
	getCM := func(name string, optional bool) (*v1.ConfigMap, error) {
		if cm, ok := cms[name]; ok {
			return cm, nil
		}
		cm, err := client.CoreV1().ConfigMaps(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) && optional {
				return nil, nil
			}
			if apierrors.IsNotFound(err) {
				return nil, &ConfigError{Msg: fmt.Sprintf("configmap %q not found", name)}
			}
			return nil, err
		}
		cms[name] = cm
		return cm, nil
	}
	getSecret := func(name string, optional bool) (*v1.Secret, error) {
		if s, ok := secrets[name]; ok {
			return s, nil
		}
		s, err := client.CoreV1().Secrets(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) && optional {
				return nil, nil
			}
			if apierrors.IsNotFound(err) {
				return nil, &ConfigError{Msg: fmt.Sprintf("secret %q not found", name)}
			}
			return nil, err
		}
		secrets[name] = s
		return s, nil
	}
	for _, ef := range c.EnvFrom {
		switch {
		case ef.ConfigMapRef != nil:
			cm, err := getCM(ef.ConfigMapRef.Name, ef.ConfigMapRef.Optional != nil && *ef.ConfigMapRef.Optional)
			if err != nil {
				return nil, err
			}
			if cm != nil {
				for _, k := range sortedKeys(cm.Data) {
					if name := ef.Prefix + k; len(validation.IsEnvVarName(name)) == 0 {
						set(name, cm.Data[k])
					}
				}
			}
		case ef.SecretRef != nil:
			s, err := getSecret(ef.SecretRef.Name, ef.SecretRef.Optional != nil && *ef.SecretRef.Optional)
			if err != nil {
				return nil, err
			}
			if s != nil {
				keys := make([]string, 0, len(s.Data))
				for k := range s.Data {
					keys = append(keys, k)
				}
				sort.Strings(keys)
				for _, k := range keys {
					if name := ef.Prefix + k; len(validation.IsEnvVarName(name)) == 0 {
						set(name, string(s.Data[k]))
					}
				}
			}
		}
	}
	mapping := expansion.MappingFuncFor(vars)
	for _, e := range c.Env {
		var val string
		switch {
		case e.ValueFrom == nil:
			val = expansion.Expand(e.Value, mapping)
		case e.ValueFrom.FieldRef != nil:
			v, err := fieldValue(p, e.ValueFrom.FieldRef.FieldPath)
			if err != nil {
				return nil, &ConfigError{Msg: fmt.Sprintf("env %s: %v", e.Name, err)}
			}
			val = v
		case e.ValueFrom.ResourceFieldRef != nil:
			v, err := resource.ExtractContainerResourceValue(e.ValueFrom.ResourceFieldRef, c)
			if err != nil {
				return nil, &ConfigError{Msg: fmt.Sprintf("env %s: %v", e.Name, err)}
			}
			val = v
		case e.ValueFrom.ConfigMapKeyRef != nil:
			ref := e.ValueFrom.ConfigMapKeyRef
			optional := ref.Optional != nil && *ref.Optional
			cm, err := getCM(ref.Name, optional)
			if err != nil {
				return nil, err
			}
			if cm == nil {
				continue
			}
			v, ok := cm.Data[ref.Key]
			if !ok {
				if optional {
					continue
				}
				return nil, &ConfigError{Msg: fmt.Sprintf("couldn't find key %s in ConfigMap %s/%s", ref.Key, pod.Namespace, ref.Name)}
			}
			val = v
		case e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			optional := ref.Optional != nil && *ref.Optional
			s, err := getSecret(ref.Name, optional)
			if err != nil {
				return nil, err
			}
			if s == nil {
				continue
			}
			v, ok := s.Data[ref.Key]
			if !ok {
				if optional {
					continue
				}
				return nil, &ConfigError{Msg: fmt.Sprintf("couldn't find key %s in Secret %s/%s", ref.Key, pod.Namespace, ref.Name)}
			}
			val = string(v)
		}
		set(e.Name, val)
	}
	out := make([]string, 0, len(order))
	for _, k := range order {
		out = append(out, k+"="+vars[k])
	}
	return out, nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// fieldValue is podFieldSelectorRuntimeValue: the status fields the kubelet knows, the rest from the object.
func fieldValue(p Pod, path string) (string, error) {
	switch path {
	case "spec.nodeName":
		return p.Pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return p.Pod.Spec.ServiceAccountName, nil
	case "status.hostIP", "status.hostIPs":
		return p.HostIP, nil
	case "status.podIP", "status.podIPs":
		return p.PodIP, nil
	}
	return fieldpath.ExtractFieldPathAsString(p.Pod, path)
}

// serviceEnv is the docker-links style variables of a Service (FOO_SERVICE_HOST, FOO_SERVICE_PORT, ...).
func serviceEnv(svc *v1.Service) [][2]string {
	if svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == v1.ClusterIPNone || len(svc.Spec.Ports) == 0 {
		return nil
	}
	name := strings.ToUpper(strings.ReplaceAll(svc.Name, "-", "_"))
	host := svc.Spec.ClusterIP
	first := svc.Spec.Ports[0]
	out := [][2]string{{name + "_SERVICE_HOST", host}, {name + "_SERVICE_PORT", strconv.Itoa(int(first.Port))}}
	for _, p := range svc.Spec.Ports {
		if p.Name != "" {
			out = append(out, [2]string{name + "_SERVICE_PORT_" + strings.ToUpper(strings.ReplaceAll(p.Name, "-", "_")), strconv.Itoa(int(p.Port))})
		}
	}
	proto := strings.ToLower(string(first.Protocol))
	if proto == "" {
		proto = "tcp"
	}
	out = append(out, [2]string{name + "_PORT", fmt.Sprintf("%s://%s:%d", proto, host, first.Port)})
	for _, p := range svc.Spec.Ports {
		pr := strings.ToUpper(string(p.Protocol))
		if pr == "" {
			pr = "TCP"
		}
		prefix := fmt.Sprintf("%s_PORT_%d_%s", name, p.Port, pr)
		out = append(out, [2]string{prefix, fmt.Sprintf("%s://%s:%d", strings.ToLower(pr), host, p.Port)},
			[2]string{prefix + "_PROTO", strings.ToLower(pr)}, [2]string{prefix + "_PORT", strconv.Itoa(int(p.Port))},
			[2]string{prefix + "_ADDR", host})
	}
	return out
}
