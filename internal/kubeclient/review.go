package kubeclient

import (
	"context"
	"encoding/json"
	"fmt"

	authorizationv1 "k8s.io/api/authorization/v1"
)

// SubjectAccessReview asks the API server whether a user may do what the
// review's spec says (authorization.k8s.io/v1, as kubelet's webhook
// authorizer asks for each request to its API).
func (c *Client) SubjectAccessReview(ctx context.Context, review *authorizationv1.SubjectAccessReview) (*authorizationv1.SubjectAccessReview, error) {
	in := review.DeepCopy()
	in.APIVersion, in.Kind = authorizationv1.SchemeGroupVersion.String(), "SubjectAccessReview"
	body, err := json.Marshal(in)
	if err != nil {
		return nil, err
	}
	raw, err := c.raw.Post().AbsPath("/apis/authorization.k8s.io/v1/subjectaccessreviews").
		SetHeader("Content-Type", "application/json").SetHeader("Accept", "application/json").Body(body).Do(ctx).Raw()
	if err != nil {
		return nil, fmt.Errorf("asking the API server whether user %s may %s nodes/%s: %w", review.Spec.User, verbOf(review), subresourceOf(review), err)
	}
	var out authorizationv1.SubjectAccessReview
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, fmt.Errorf("the API server's SubjectAccessReview: %w", err)
	}
	return &out, nil
}

func verbOf(r *authorizationv1.SubjectAccessReview) string {
	if ra := r.Spec.ResourceAttributes; ra != nil {
		return ra.Verb
	}
	return ""
}

func subresourceOf(r *authorizationv1.SubjectAccessReview) string {
	if ra := r.Spec.ResourceAttributes; ra != nil {
		return ra.Subresource
	}
	return ""
}
