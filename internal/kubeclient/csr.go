package kubeclient

import (
	"context"
	"encoding/json"
	"fmt"

	certificatesv1 "k8s.io/api/certificates/v1"
)

// CertificateSigningRequests (certificates.k8s.io/v1), as kubelet asks
// for its serving certificate (serverTLSBootstrap).

const csrPath = "/apis/certificates.k8s.io/v1/certificatesigningrequests"

// CreateCSR creates the request.
func (c *Client) CreateCSR(ctx context.Context, csr *certificatesv1.CertificateSigningRequest) (*certificatesv1.CertificateSigningRequest, error) {
	in := csr.DeepCopy()
	in.APIVersion, in.Kind = certificatesv1.SchemeGroupVersion.String(), "CertificateSigningRequest"
	return c.csrCall(ctx, "POST", csrPath, in)
}

// GetCSR reads the request (its status has the certificate once signed).
func (c *Client) GetCSR(ctx context.Context, name string) (*certificatesv1.CertificateSigningRequest, error) {
	return c.csrCall(ctx, "GET", csrPath+"/"+name, nil)
}

// ApproveCSR writes the request's Approved condition (its approval
// subresource), as `kubectl certificate approve` does.
func (c *Client) ApproveCSR(ctx context.Context, csr *certificatesv1.CertificateSigningRequest, reason, message string) (*certificatesv1.CertificateSigningRequest, error) {
	in := csr.DeepCopy()
	in.APIVersion, in.Kind = certificatesv1.SchemeGroupVersion.String(), "CertificateSigningRequest"
	in.Status.Conditions = append(in.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: certificatesv1.CertificateApproved, Status: "True", Reason: reason, Message: message,
	})
	return c.csrCall(ctx, "PUT", csrPath+"/"+csr.Name+"/approval", in)
}

func (c *Client) csrCall(ctx context.Context, method, path string, body *certificatesv1.CertificateSigningRequest) (*certificatesv1.CertificateSigningRequest, error) {
	req := c.raw.Verb(method).AbsPath(path).SetHeader("Accept", "application/json")
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		req = req.SetHeader("Content-Type", "application/json").Body(data)
	}
	raw, err := req.Do(ctx).Raw()
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	var out certificatesv1.CertificateSigningRequest
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	return &out, nil
}
