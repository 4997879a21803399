package kubeclient

import (
	"context"
	"encoding/json"
	"fmt"

	authenticationv1 "k8s.io/api/authentication/v1"
)

// CreateToken asks the API server for a service account token bound to a
// pod (TokenRequest, as kubelet does for a projected token volume).
func (c *Client) CreateToken(ctx context.Context, namespace, serviceAccount string, req *authenticationv1.TokenRequest) (*authenticationv1.TokenRequest, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	raw, err := c.core.Post().Namespace(namespace).Resource("serviceaccounts").Name(serviceAccount).SubResource("token").
		SetHeader("Content-Type", "application/json").SetHeader("Accept", "application/json").Body(body).Do(ctx).Raw()
	if err != nil {
		return nil, fmt.Errorf("requesting a token of service account %s/%s: %w", namespace, serviceAccount, err)
	}
	var out authenticationv1.TokenRequest
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, fmt.Errorf("token of service account %s/%s: %w", namespace, serviceAccount, err)
	}
	return &out, nil
}
