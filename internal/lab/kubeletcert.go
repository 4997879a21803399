package lab

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The kubelet API's serving certificate, as kubelet's with
// serverTLSBootstrap: it starts with its own, self-signed, and asks the
// cluster's CA for one through a CertificateSigningRequest of signer
// kubernetes.io/kubelet-serving (subject system:node:NODE in group
// system:nodes, the node's name and address as SANs), which
// kube-controller-manager's signing controller signs once it is approved.
// Nothing in Kubernetes approves these on its own; a lab kubelet whose
// credentials may approve it (the cluster admin's, as the lab's are)
// approves its own, else it waits for someone to (`kubectl certificate
// approve`). Once signed, new connections get it: an API server started
// with --kubelet-certificate-authority then accepts the kubelet.

// kubeletServingSigner is the signer of kubelets' serving certificates.
const kubeletServingSigner = "kubernetes.io/kubelet-serving"

// servingCertWait is how long the kubelet waits for its request to be
// approved and signed before it keeps its own certificate.
const servingCertWait = 2 * time.Minute

// servingCert is the kubelet API's current certificate.
type servingCert struct {
	mu   sync.RWMutex
	cert *tls.Certificate
}

func (s *servingCert) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.cert, nil
}

func (s *servingCert) set(c tls.Certificate) {
	s.mu.Lock()
	s.cert = &c
	s.mu.Unlock()
}

// csrAPI is the part of the API client a certificate request takes.
type csrAPI interface {
	CreateCSR(context.Context, *certificatesv1.CertificateSigningRequest) (*certificatesv1.CertificateSigningRequest, error)
	GetCSR(context.Context, string) (*certificatesv1.CertificateSigningRequest, error)
	ApproveCSR(context.Context, *certificatesv1.CertificateSigningRequest, string, string) (*certificatesv1.CertificateSigningRequest, error)
}

// requestServingCert asks for a serving certificate of the cluster's CA
// and waits (polling every poll) until it is signed.
func requestServingCert(ctx context.Context, api csrAPI, node string, ip netip.Addr, poll time.Duration, approved func(error)) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject:     pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}},
		DNSNames:    []string{node},
		IPAddresses: []net.IP{ip.AsSlice()},
	}, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	csr, err := api.CreateCSR(ctx, &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "csr-"},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			SignerName: kubeletServingSigner,
			Usages:     []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth},
		},
	})
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("requesting a serving certificate of the cluster's CA: %w", err)
	}
	_, err = api.ApproveCSR(ctx, csr, "LabKubeletServing", "the shunt lab's kubelet approves its own serving certificate (its credentials may)")
	approved(err)
	for {
		got, err := api.GetCSR(ctx, csr.Name)
		if err != nil && !apierrors.IsNotFound(err) {
			return tls.Certificate{}, err
		}
		if got != nil {
			for _, c := range got.Status.Conditions {
				if c.Type == certificatesv1.CertificateDenied || c.Type == certificatesv1.CertificateFailed {
					return tls.Certificate{}, fmt.Errorf("CertificateSigningRequest %s: %s: %s", csr.Name, c.Reason, c.Message)
				}
			}
			if len(got.Status.Certificate) > 0 {
				return servingKeyPair(got.Status.Certificate, key)
			}
		}
		select {
		case <-ctx.Done():
			return tls.Certificate{}, fmt.Errorf("CertificateSigningRequest %s is not signed yet (approved? kube-controller-manager's certificatesigningrequest-signing-controller with --cluster-signing-cert-file?): %w", csr.Name, ctx.Err())
		case <-time.After(poll):
		}
	}
}

// servingKeyPair is the signed chain (PEM) with its key.
func servingKeyPair(chainPEM []byte, key *ecdsa.PrivateKey) (tls.Certificate, error) {
	var out tls.Certificate
	for rest := chainPEM; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		if b.Type == "CERTIFICATE" {
			out.Certificate = append(out.Certificate, b.Bytes)
		}
	}
	if len(out.Certificate) == 0 {
		return out, errors.New("the signed certificate holds no PEM certificate")
	}
	leaf, err := x509.ParseCertificate(out.Certificate[0])
	if err != nil {
		return out, err
	}
	if pub, ok := leaf.PublicKey.(*ecdsa.PublicKey); !ok || !pub.Equal(key.Public()) {
		return out, errors.New("the signed certificate is not for the requested key")
	}
	out.PrivateKey, out.Leaf = key, leaf
	return out, nil
}
