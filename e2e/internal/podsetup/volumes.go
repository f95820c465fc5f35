package podsetup

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
	authv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/kubernetes/pkg/api/v1/resource"
	"k8s.io/kubernetes/pkg/fieldpath"

	"github.com/gpushare/devplugin/e2e/internal/oci"
)

// MountError is a volume the kubelet cannot set up: the pod waits in ContainerCreating, the kubelet's FailedMount
// event text as its message, and the kubelet tries again.
type MountError struct{ Volume, Msg string }

func (e *MountError) Error() string {
	return fmt.Sprintf("MountVolume.SetUp failed for volume %q : %s", e.Volume, e.Msg)
}

// Volumes are a pod's volumes on the node: name -> the directory or file on the node.
type Volumes map[string]string

// SetUpVolumes makes the pod's volumes under dir (one directory each, in the pod's directory): emptyDir (a tmpfs for
// medium Memory), configMap, secret, projected (service-account token, configMap, secret, downwardAPI),
// downwardAPI, hostPath. A token is requested from the apiserver with the pod as its bound object, as the kubelet's
// token manager does.
func SetUpVolumes(ctx context.Context, client kubernetes.Interface, p Pod, dir string) (Volumes, error) {
	pod := p.Pod
	out := Volumes{}
	for _, vol := range pod.Spec.Volumes {
		path := filepath.Join(dir, vol.Name)
		var err error
		switch {
		case vol.EmptyDir != nil:
			err = os.MkdirAll(path, 0o777)
			if err == nil {
				_ = os.Chmod(path, 0o777)
			}
			if err == nil && vol.EmptyDir.Medium == v1.StorageMediumMemory && !mounted(path) {
				err = unix.Mount("tmpfs", path, "tmpfs", 0, "mode=1777")
			}
		case vol.HostPath != nil:
			path, err = hostPath(vol.HostPath)
		case vol.ConfigMap != nil:
			err = writeConfigMap(ctx, client, pod.Namespace, vol.ConfigMap.LocalObjectReference.Name, vol.ConfigMap.Items,
				vol.ConfigMap.Optional, vol.ConfigMap.DefaultMode, path)
		case vol.Secret != nil:
			err = writeSecret(ctx, client, pod.Namespace, vol.Secret.SecretName, vol.Secret.Items, vol.Secret.Optional,
				vol.Secret.DefaultMode, path)
		case vol.DownwardAPI != nil:
			err = writeDownward(p, vol.DownwardAPI.Items, vol.DownwardAPI.DefaultMode, path)
		case vol.Projected != nil:
			err = writeProjected(ctx, client, p, vol.Projected, path)
		default:
			err = fmt.Errorf("the test node supports emptyDir, hostPath, configMap, secret, downwardAPI and projected volumes only")
		}
		if err != nil {
			if me, ok := err.(*MountError); ok {
				return nil, me
			}
			return nil, &MountError{Volume: vol.Name, Msg: err.Error()}
		}
		out[vol.Name] = path
	}
	return out, nil
}

func mounted(path string) bool {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && f[4] == path {
			return true
		}
	}
	return false
}

func hostPath(h *v1.HostPathVolumeSource) (string, error) {
	t := v1.HostPathUnset
	if h.Type != nil {
		t = *h.Type
	}
	st, err := os.Stat(h.Path)
	switch t {
	case v1.HostPathDirectoryOrCreate:
		if os.IsNotExist(err) {
			return h.Path, os.MkdirAll(h.Path, 0o755)
		}
		if err == nil && !st.IsDir() {
			return "", fmt.Errorf("hostPath type check failed: %s is not a directory", h.Path)
		}
	case v1.HostPathFileOrCreate:
		if os.IsNotExist(err) {
			f, cerr := os.OpenFile(h.Path, os.O_CREATE|os.O_WRONLY, 0o644)
			if cerr == nil {
				f.Close()
			}
			return h.Path, cerr
		}
	case v1.HostPathDirectory:
		if err != nil || !st.IsDir() {
			return "", fmt.Errorf("hostPath type check failed: %s is not a directory", h.Path)
		}
	case v1.HostPathFile:
		if err != nil || !st.Mode().IsRegular() {
			return "", fmt.Errorf("hostPath type check failed: %s is not a file", h.Path)
		}
	case v1.HostPathSocket:
		if err != nil || st.Mode()&os.ModeSocket == 0 {
			return "", fmt.Errorf("hostPath type check failed: %s is not a socket file", h.Path)
		}
	case v1.HostPathCharDev:
		if err != nil || st.Mode()&os.ModeCharDevice == 0 {
			return "", fmt.Errorf("hostPath type check failed: %s is not a character device", h.Path)
		}
	case v1.HostPathBlockDev:
		if err != nil || st.Mode()&os.ModeDevice == 0 || st.Mode()&os.ModeCharDevice != 0 {
			return "", fmt.Errorf("hostPath type check failed: %s is not a block device", h.Path)
		}
	}
	return h.Path, nil
}

func mode(m *int32, def os.FileMode) os.FileMode {
	if m == nil {
		return def
	}
	return os.FileMode(*m)
}

// writeFiles makes dir hold exactly files (relative path -> content). The directory itself is kept (its containers
// have it bind-mounted: a restarted node agent sets a running pod's volumes up again), files it no longer holds
// are removed, and each file is written whole under a temporary name and renamed into place.
func writeFiles(dir string, files map[string][]byte, perm os.FileMode) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	keep := map[string]bool{}
	for rel, data := range files {
		clean := filepath.Clean(rel)
		if filepath.IsAbs(clean) || clean == ".." || strings.HasPrefix(clean, "../") {
			return fmt.Errorf("path %q escapes the volume", rel)
		}
		keep[clean] = true
		p := filepath.Join(dir, clean)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		tmp := p + ".tmp"
		if err := os.WriteFile(tmp, data, perm); err != nil {
			return err
		}
		_ = os.Chmod(tmp, perm)
		if err := os.Rename(tmp, p); err != nil {
			return err
		}
	}
	return filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		if !keep[rel] {
			return os.Remove(path)
		}
		return nil
	})
}

func pick(data map[string][]byte, items []v1.KeyToPath, what, ns, name string, optional bool) (map[string][]byte, error) {
	out := map[string][]byte{}
	if len(items) == 0 {
		for k, v := range data {
			out[k] = v
		}
		return out, nil
	}
	for _, it := range items {
		v, ok := data[it.Key]
		if !ok {
			if optional {
				continue
			}
			return nil, fmt.Errorf("configmap references non-existent config key: %s", it.Key)
		}
		out[it.Path] = v
	}
	return out, nil
}

func configMapData(ctx context.Context, client kubernetes.Interface, ns, name string, optional *bool) (map[string][]byte, bool, error) {
	cm, err := client.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) && optional != nil && *optional {
			return nil, false, nil
		}
		if apierrors.IsNotFound(err) {
			return nil, false, fmt.Errorf("configmap %q not found", name)
		}
		return nil, false, err
	}
	data := map[string][]byte{}
	for k, v := range cm.Data {
		data[k] = []byte(v)
	}
	for k, v := range cm.BinaryData {
		data[k] = v
	}
	return data, true, nil
}

func secretData(ctx context.Context, client kubernetes.Interface, ns, name string, optional *bool) (map[string][]byte, bool, error) {
	s, err := client.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) && optional != nil && *optional {
			return nil, false, nil
		}
		if apierrors.IsNotFound(err) {
			return nil, false, fmt.Errorf("secret %q not found", name)
		}
		return nil, false, err
	}
	return s.Data, true, nil
}

func writeConfigMap(ctx context.Context, client kubernetes.Interface, ns, name string, items []v1.KeyToPath, optional *bool, defMode *int32, dir string) error {
	data, _, err := configMapData(ctx, client, ns, name, optional)
	if err != nil {
		return err
	}
	files, err := pick(data, items, "configmap", ns, name, optional != nil && *optional)
	if err != nil {
		return err
	}
	return writeFiles(dir, files, mode(defMode, 0o644))
}

func writeSecret(ctx context.Context, client kubernetes.Interface, ns, name string, items []v1.KeyToPath, optional *bool, defMode *int32, dir string) error {
	data, _, err := secretData(ctx, client, ns, name, optional)
	if err != nil {
		return err
	}
	files, err := pick(data, items, "secret", ns, name, optional != nil && *optional)
	if err != nil {
		return err
	}
	return writeFiles(dir, files, mode(defMode, 0o644))
}

func downwardFiles(p Pod, items []v1.DownwardAPIVolumeFile) (map[string][]byte, error) {
	out := map[string][]byte{}
	for _, it := range items {
		switch {
		case it.FieldRef != nil:
			v, err := fieldValue(p, it.FieldRef.FieldPath)
			if err != nil {
				return nil, err
			}
			if it.FieldRef.FieldPath == "metadata.labels" || it.FieldRef.FieldPath == "metadata.annotations" {
				v, _ = fieldpath.ExtractFieldPathAsString(p.Pod, it.FieldRef.FieldPath)
			}
			out[it.Path] = []byte(v)
		case it.ResourceFieldRef != nil:
			v, err := resource.ExtractResourceValueByContainerName(it.ResourceFieldRef, p.Pod, it.ResourceFieldRef.ContainerName)
			if err != nil {
				return nil, err
			}
			out[it.Path] = []byte(v)
		}
	}
	return out, nil
}

func writeDownward(p Pod, items []v1.DownwardAPIVolumeFile, defMode *int32, dir string) error {
	files, err := downwardFiles(p, items)
	if err != nil {
		return err
	}
	return writeFiles(dir, files, mode(defMode, 0o644))
}

func writeProjected(ctx context.Context, client kubernetes.Interface, p Pod, pr *v1.ProjectedVolumeSource, dir string) error {
	pod := p.Pod
	files := map[string][]byte{}
	for _, src := range pr.Sources {
		switch {
		case src.ServiceAccountToken != nil:
			t := src.ServiceAccountToken
			exp := int64(3607)
			if t.ExpirationSeconds != nil {
				exp = *t.ExpirationSeconds
			}
			var aud []string
			if t.Audience != "" {
				aud = []string{t.Audience}
			}
			sa := pod.Spec.ServiceAccountName
			if sa == "" {
				sa = "default"
			}
			tr, err := client.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, sa, &authv1.TokenRequest{
				Spec: authv1.TokenRequestSpec{Audiences: aud, ExpirationSeconds: &exp, BoundObjectRef: &authv1.BoundObjectReference{
					Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}},
			}, metav1.CreateOptions{})
			if err != nil {
				return fmt.Errorf("failed to fetch token: %w", err)
			}
			files[t.Path] = []byte(tr.Status.Token)
		case src.ConfigMap != nil:
			data, ok, err := configMapData(ctx, client, pod.Namespace, src.ConfigMap.Name, src.ConfigMap.Optional)
			if err != nil {
				return err
			}
			if ok {
				sel, err := pick(data, src.ConfigMap.Items, "configmap", pod.Namespace, src.ConfigMap.Name, src.ConfigMap.Optional != nil && *src.ConfigMap.Optional)
				if err != nil {
					return err
				}
				for k, v := range sel {
					files[k] = v
				}
			}
		case src.Secret != nil:
			data, ok, err := secretData(ctx, client, pod.Namespace, src.Secret.Name, src.Secret.Optional)
			if err != nil {
				return err
			}
			if ok {
				sel, err := pick(data, src.Secret.Items, "secret", pod.Namespace, src.Secret.Name, src.Secret.Optional != nil && *src.Secret.Optional)
				if err != nil {
					return err
				}
				for k, v := range sel {
					files[k] = v
				}
			}
		case src.DownwardAPI != nil:
			sel, err := downwardFiles(p, src.DownwardAPI.Items)
			if err != nil {
				return err
			}
			for k, v := range sel {
				files[k] = v
			}
		}
	}
	return writeFiles(dir, files, mode(pr.DefaultMode, 0o644))
}

// ContainerMounts are the container's volumeMounts as mounts of the node's volume directories (subPath and
// subPathExpr resolved), in the order the pod spec lists them, shortest destination first as the runtime mounts them.
func ContainerMounts(c *v1.Container, vols Volumes, env []string) ([]oci.Mount, error) {
	envMap := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		envMap[k] = v
	}
	var out []oci.Mount
	for _, vm := range c.VolumeMounts {
		src, ok := vols[vm.Name]
		if !ok {
			return nil, &ConfigError{Msg: fmt.Sprintf("volume %q of volumeMount %s is not a volume of the pod", vm.Name, vm.MountPath)}
		}
		sub := vm.SubPath
		if vm.SubPathExpr != "" {
			sub = expandSimple(vm.SubPathExpr, envMap)
		}
		if sub != "" {
			clean := filepath.Clean(sub)
			if filepath.IsAbs(clean) || clean == ".." || strings.HasPrefix(clean, "../") {
				return nil, &ConfigError{Msg: fmt.Sprintf("subPath %q of volumeMount %s escapes its volume", sub, vm.MountPath)}
			}
			src = filepath.Join(src, clean)
			if _, err := os.Stat(src); os.IsNotExist(err) {
				if err := os.MkdirAll(src, 0o755); err != nil {
					return nil, &ConfigError{Msg: fmt.Sprintf("subPath %s: %v", sub, err)}
				}
			}
		}
		out = append(out, oci.Mount{Source: src, Destination: vm.MountPath, ReadOnly: vm.ReadOnly})
	}
	sort.SliceStable(out, func(i, j int) bool {
		return strings.Count(filepath.Clean(out[i].Destination), "/") < strings.Count(filepath.Clean(out[j].Destination), "/")
	})
	return out, nil
}

func expandSimple(s string, env map[string]string) string {
	for k, v := range env {
		s = strings.ReplaceAll(s, "$("+k+")", v)
	}
	return s
}

// TearDownVolumes unmounts the pod's memory-backed emptyDirs.
func TearDownVolumes(dir string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if mounted(p) {
			_ = unix.Unmount(p, unix.MNT_DETACH)
		}
	}
}
