package lab

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"math/big"
	"net/netip"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// csrSigner plays the certificates API for requestServingCert: it keeps
// the request, signs it with a test CA once approved (as
// kube-controller-manager's signer does), or denies it.
type csrSigner struct {
	ca       testCA
	csr      *certificatesv1.CertificateSigningRequest
	approve  error // what ApproveCSR answers
	deny     bool
	polls    int
	otherKey bool // sign another key than the request's
}

func (s *csrSigner) CreateCSR(_ context.Context, c *certificatesv1.CertificateSigningRequest) (*certificatesv1.CertificateSigningRequest, error) {
	s.csr = c.DeepCopy()
	s.csr.Name = "csr-1"
	return s.csr, nil
}

func (s *csrSigner) ApproveCSR(_ context.Context, c *certificatesv1.CertificateSigningRequest, _, _ string) (*certificatesv1.CertificateSigningRequest, error) {
	if s.approve != nil {
		return nil, s.approve
	}
	s.csr.Status.Conditions = append(s.csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{Type: certificatesv1.CertificateApproved})
	return s.csr, nil
}

func (s *csrSigner) GetCSR(context.Context, string) (*certificatesv1.CertificateSigningRequest, error) {
	s.polls++
	if s.deny {
		s.csr.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{Type: certificatesv1.CertificateDenied, Reason: "NotANode"}}
		return s.csr, nil
	}
	if len(s.csr.Status.Conditions) == 0 || s.polls < 2 {
		return s.csr, nil // not approved, or not signed yet
	}
	block, _ := pem.Decode(s.csr.Spec.Request)
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, err
	}
	pub := req.PublicKey
	if s.otherKey {
		pub = s.ca.key.Public()
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: req.Subject, DNSNames: req.DNSNames, IPAddresses: req.IPAddresses,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, s.ca.cert, pub, s.ca.key)
	if err != nil {
		return nil, err
	}
	s.csr.Status.Certificate = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	return s.csr, nil
}

// The kubelet asks for a kubelet-serving certificate for its node's name
// and address, approves its request, and serves what the CA signed; a
// denied request, a certificate for another key, or no approval before
// the deadline leave it an error (and its own certificate).
func TestRequestServingCert(t *testing.T) {
	ca := newTestCA(t)
	ip := netip.MustParseAddr("192.0.2.7")
	s := &csrSigner{ca: ca}
	var approveErr error
	cert, err := requestServingCert(context.Background(), s, "n1", ip, time.Millisecond, func(err error) { approveErr = err })
	if err != nil || approveErr != nil {
		t.Fatalf("%v (approval: %v)", err, approveErr)
	}
	if s.csr.Spec.SignerName != "kubernetes.io/kubelet-serving" || !strings.Contains(string(s.csr.Spec.Request), "CERTIFICATE REQUEST") {
		t.Errorf("request %+v", s.csr.Spec)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	if _, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: "n1", KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Errorf("the certificate does not verify for n1 against the CA: %v", err)
	}
	if cert.Leaf.Subject.CommonName != "system:node:n1" || len(cert.Leaf.IPAddresses) != 1 || !cert.Leaf.IPAddresses[0].Equal(ip.AsSlice()) {
		t.Errorf("subject %s, addresses %v", cert.Leaf.Subject, cert.Leaf.IPAddresses)
	}

	if _, err := requestServingCert(context.Background(), &csrSigner{ca: ca, deny: true}, "n1", ip, time.Millisecond, func(error) {}); err == nil || !strings.Contains(err.Error(), "NotANode") {
		t.Errorf("a denied request: %v", err)
	}
	if _, err := requestServingCert(context.Background(), &csrSigner{ca: ca, otherKey: true}, "n1", ip, time.Millisecond, func(error) {}); err == nil {
		t.Error("a certificate for another key was taken")
	}
	// The kubelet may not approve, and no one else does.
	forbidden := apierrors.NewForbidden(schema.GroupResource{Group: "certificates.k8s.io", Resource: "signers"}, "kubernetes.io/kubelet-serving", errors.New("no"))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = requestServingCert(ctx, &csrSigner{ca: ca, approve: forbidden}, "n1", ip, time.Millisecond, func(err error) { approveErr = err })
	if !apierrors.IsForbidden(approveErr) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("unapproved: approval %v, result %v; want forbidden, then the deadline", approveErr, err)
	}
}
