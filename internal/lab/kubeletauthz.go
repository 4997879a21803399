package lab

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// Who may call the kubelet API: as kubelet with --authorization-mode
// Webhook (kubeadm's), the API server decides. Each request's client
// (the user and groups of its certificate, which the cluster's CA
// signed) is asked about in a SubjectAccessReview of the node: resource
// nodes, the node's name, the request's verb (GET get, POST create, ...)
// and subresource (proxy for exec, attach, port-forward and logs of
// containers; healthz, then proxy, for /healthz, as kubelet's
// fine-grained authorization). Decisions are cached as kubelet's webhook
// caches them (allowed 5 minutes, denied 30 seconds).
//
// A kubelet that may not create SubjectAccessReviews (its credentials lack
// the right) falls back to what the lab did before: clients in group
// system:masters only, and says so once.

const (
	authzAllowedTTL = 5 * time.Minute
	authzDeniedTTL  = 30 * time.Second
)

// kubeletAuthorizer says whether a client may make a request.
type kubeletAuthorizer interface {
	allowed(ctx context.Context, user string, groups []string, verb string, subresources []string) (bool, error)
}

// mastersOnly is the rule without the API server: group system:masters.
type mastersOnly struct{}

func (mastersOnly) allowed(_ context.Context, _ string, groups []string, _ string, _ []string) (bool, error) {
	return slices.Contains(groups, kubeletAPIGroup), nil
}

// reviewAuthorizer asks the API server (SubjectAccessReview).
type reviewAuthorizer struct {
	node   string
	review func(context.Context, *authorizationv1.SubjectAccessReview) (*authorizationv1.SubjectAccessReview, error)
	log    *slog.Logger
	now    func() time.Time

	mu       sync.Mutex
	cache    map[string]authzDecision
	fallback bool // the API server refused to review: mastersOnly
}

type authzDecision struct {
	allowed bool
	until   time.Time
}

func newReviewAuthorizer(node string, review func(context.Context, *authorizationv1.SubjectAccessReview) (*authorizationv1.SubjectAccessReview, error), log *slog.Logger) *reviewAuthorizer {
	return &reviewAuthorizer{node: node, review: review, log: log, now: time.Now, cache: map[string]authzDecision{}}
}

func (a *reviewAuthorizer) allowed(ctx context.Context, user string, groups []string, verb string, subresources []string) (bool, error) {
	for _, sub := range subresources {
		ok, err := a.allowedOne(ctx, user, groups, verb, sub)
		if err != nil || ok {
			return ok, err
		}
	}
	return false, nil
}

func (a *reviewAuthorizer) allowedOne(ctx context.Context, user string, groups []string, verb, sub string) (bool, error) {
	key := strings.Join([]string{user, strings.Join(groups, ","), verb, sub}, "\x00")
	a.mu.Lock()
	d, cached := a.cache[key]
	fallback := a.fallback
	a.mu.Unlock()
	if fallback {
		return mastersOnly{}.allowed(ctx, user, groups, verb, nil)
	}
	if cached && a.now().Before(d.until) {
		return d.allowed, nil
	}
	out, err := a.review(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: user, Groups: groups,
		ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: verb, Version: "v1", Resource: "nodes", Subresource: sub, Name: a.node},
	}})
	if apierrors.IsForbidden(err) {
		a.mu.Lock()
		a.fallback = true
		a.mu.Unlock()
		a.log.Warn("the kubelet may not create SubjectAccessReviews: its API serves clients in group system:masters only (grant its user create on subjectaccessreviews.authorization.k8s.io)", "err", err)
		return mastersOnly{}.allowed(ctx, user, groups, verb, nil)
	}
	if err != nil {
		return false, err
	}
	d = authzDecision{allowed: out.Status.Allowed, until: a.now().Add(authzDeniedTTL)}
	if d.allowed {
		d.until = a.now().Add(authzAllowedTTL)
	}
	a.mu.Lock()
	a.cache[key] = d
	a.mu.Unlock()
	return d.allowed, nil
}

// kubeletVerb is the API verb of a request's method, as kubelet maps it.
func kubeletVerb(method string) string {
	switch method {
	case http.MethodPost:
		return "create"
	case http.MethodGet, http.MethodHead:
		return "get"
	case http.MethodPut:
		return "update"
	case http.MethodPatch:
		return "patch"
	case http.MethodDelete:
		return "delete"
	}
	return ""
}

// kubeletSubresources are the nodes subresources a request's path is
// checked as, in order (kubelet's GetRequestAttributes).
func kubeletSubresources(path string) []string {
	if path == "/healthz" || strings.HasPrefix(path, "/healthz/") {
		return []string{"healthz", "proxy"}
	}
	return []string{"proxy"}
}

// authorized lets a request through when its client may make it: TLS has
// checked the client's certificate against the cluster's CA; authz
// decides.
func authorized(authz kubeletAuthorizer, log *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
			http.Error(w, "Unauthorized: a client certificate is required", http.StatusUnauthorized)
			return
		}
		subject := r.TLS.PeerCertificates[0].Subject
		verb, subs := kubeletVerb(r.Method), kubeletSubresources(r.URL.Path)
		ok, err := authz.allowed(r.Context(), subject.CommonName, subject.Organization, verb, subs)
		if err != nil {
			log.Warn("kubelet API: authorization failed", "user", subject.CommonName, "err", err)
			http.Error(w, fmt.Sprintf("Authorization error (user=%s, verb=%s, resource=nodes, subresource(s)=%v): %v", subject.CommonName, verb, subs, err), http.StatusInternalServerError)
			return
		}
		if !ok {
			http.Error(w, fmt.Sprintf("Forbidden (user=%s, verb=%s, resource=nodes, subresource(s)=%v)", subject.CommonName, verb, subs), http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}
