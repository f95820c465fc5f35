#!/bin/sh
# The scheduler service's TLS for clusters without cert-manager: a self-signed CA and a serving certificate for the
# Service, written with an overlay that uses them instead of cert-manager's.
#
#   deploy/gen-certs.sh OUTDIR [OVERLAY]      OVERLAY: deploy/overlays/with-scheduler (default) or second-scheduler
#   kubectl apply -k OUTDIR
#
# OUTDIR receives:
#   ca.crt, ca.key        the CA (kept when OUTDIR already has one: run again to renew the serving pair only)
#   tls.crt, tls.key      the serving pair; SAN: <service>.<namespace>.svc and <service>.<namespace>.svc.cluster.local
#   client.crt, client.key  kube-scheduler's client certificate (CN kube-scheduler): the extender's verbs answer
#                         only it; copy it to the control-plane hosts (scheduler/kube-scheduler-config.yaml)
#   client-secret.yaml    the same pair as the Secret devplugin-scheduler-client (for the second scheduler)
#   apiserver.crt, apiserver.key  the apiserver's client certificate for the webhooks (CN kube-apiserver): copy it
#                         to the control-plane hosts once you turn on --webhook-client-names (docs/guide/install.md)
#   secret.yaml           the Secret the service mounts (tls.crt, tls.key, ca.crt), as cert-manager would write it
#   ca-bundle.b64         the CA, base64: the webhooks' caBundle
#   kustomization.yaml    OVERLAY without the cert-manager objects, with secret.yaml and the caBundle
# Keep ca.key private (it can sign certificates the webhooks and kube-scheduler trust). The default kube-scheduler
# (scheduler/kube-scheduler-config.yaml) reads the CA from /etc/kubernetes/devplugin-scheduler-ca.crt: copy ca.crt
# there on each control-plane node.
#
# Environment: SERVICE (devplugin-scheduler), NAMESPACE (kube-system), SECRET (devplugin-scheduler-tls),
# DAYS (365, the serving certificate), CA_DAYS (3650).
set -eu

usage() { echo "usage: $0 OUTDIR [OVERLAY]  (OVERLAY: a directory with a kustomization.yaml)" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 2 ] || usage
command -v openssl >/dev/null 2>&1 || { echo "$0: openssl is needed and was not found on PATH" >&2; exit 1; }

here=$(cd "$(dirname "$0")" && pwd)
out=$1
overlay=${2:-$here/overlays/with-scheduler}
[ -f "$overlay/kustomization.yaml" ] || { echo "$0: $overlay has no kustomization.yaml: name an overlay" >&2; exit 2; }
service=${SERVICE:-devplugin-scheduler}
namespace=${NAMESPACE:-kube-system}
secret=${SECRET:-devplugin-scheduler-tls}
days=${DAYS:-365}
ca_days=${CA_DAYS:-3650}
dns="$service.$namespace.svc"

mkdir -p "$out"
umask 077
if [ ! -s "$out/ca.key" ] || [ ! -s "$out/ca.crt" ]; then
    openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days "$ca_days" -subj "/CN=$service-ca" \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
        -keyout "$out/ca.key" -out "$out/ca.crt" 2>/dev/null
fi
cat > "$out/serving.cnf" <<EOF
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=DNS:$dns,DNS:$dns.cluster.local
EOF
openssl req -newkey rsa:2048 -nodes -sha256 -subj "/CN=$dns" -keyout "$out/tls.key" -out "$out/tls.csr" 2>/dev/null
openssl x509 -req -sha256 -days "$days" -in "$out/tls.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" \
    -set_serial "0x$(openssl rand -hex 16)" -extfile "$out/serving.cnf" -out "$out/tls.crt" 2>/dev/null
rm -f "$out/tls.csr" "$out/serving.cnf"
cat > "$out/client.cnf" <<EOF
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth
EOF
client_pair() {  # client_pair NAME CN: NAME.crt and NAME.key, a client certificate for CN signed by the CA
    openssl req -newkey rsa:2048 -nodes -sha256 -subj "/CN=$2" -keyout "$out/$1.key" -out "$out/$1.csr" 2>/dev/null
    openssl x509 -req -sha256 -days "$days" -in "$out/$1.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" \
        -set_serial "0x$(openssl rand -hex 16)" -extfile "$out/client.cnf" -out "$out/$1.crt" 2>/dev/null
    rm -f "$out/$1.csr"
}
client_pair client kube-scheduler
client_pair apiserver kube-apiserver
rm -f "$out/client.cnf"

b64() { openssl base64 -A < "$1"; }
b64 "$out/ca.crt" > "$out/ca-bundle.b64"
cat > "$out/secret.yaml" <<EOF
apiVersion: v1
kind: Secret
metadata:
  name: $secret
  namespace: $namespace
type: kubernetes.io/tls
data:
  tls.crt: $(b64 "$out/tls.crt")
  tls.key: $(b64 "$out/tls.key")
  ca.crt: $(b64 "$out/ca.crt")
EOF
cat > "$out/client-secret.yaml" <<EOF
apiVersion: v1
kind: Secret
metadata:
  name: devplugin-scheduler-client
  namespace: $namespace
type: kubernetes.io/tls
data:
  tls.crt: $(b64 "$out/client.crt")
  tls.key: $(b64 "$out/client.key")
EOF

overlay_abs=$(cd "$overlay" && pwd)
out_abs=$(cd "$out" && pwd)
# kustomize takes a base only by a relative path
base=$(realpath --relative-to="$out_abs" "$overlay_abs" 2>/dev/null) || {
    echo "$0: cannot express $overlay_abs relative to $out_abs (GNU realpath needed)" >&2; exit 1; }
cat > "$out/kustomization.yaml" <<EOF
# Written by deploy/gen-certs.sh: $base with the self-signed serving certificate in secret.yaml instead of
# cert-manager's. Apply with: kubectl apply -k $out
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - $base
  - secret.yaml
  - client-secret.yaml
patches:
EOF
for kind in Issuer Certificate; do
    cat >> "$out/kustomization.yaml" <<EOF
  - target: {group: cert-manager.io, kind: $kind}
    patch: |-
      \$patch: delete
      apiVersion: cert-manager.io/v1
      kind: $kind
      metadata: {name: any}
EOF
done
for kind in ValidatingWebhookConfiguration MutatingWebhookConfiguration; do
    cat >> "$out/kustomization.yaml" <<EOF
  - target: {group: admissionregistration.k8s.io, kind: $kind}
    patch: |-
      - {op: remove, path: /metadata/annotations/cert-manager.io~1inject-ca-from}
EOF
done
# Every webhook of both configurations gets the CA, copied from the Secret's ca.crt (base64, as caBundle is): a
# configuration may hold several webhooks, and one left without it fails every call (a validating one, closed).
cat >> "$out/kustomization.yaml" <<EOF
replacements:
  - source: {kind: Secret, name: $secret, fieldPath: data.ca\.crt}
    targets:
      - select: {group: admissionregistration.k8s.io, kind: ValidatingWebhookConfiguration}
        fieldPaths: [webhooks.*.clientConfig.caBundle]
        options: {create: true}
      - select: {group: admissionregistration.k8s.io, kind: MutatingWebhookConfiguration}
        fieldPaths: [webhooks.*.clientConfig.caBundle]
        options: {create: true}
EOF
echo "wrote $out: kubectl apply -k $out ; the CA for kube-scheduler hosts is $out/ca.crt" >&2
