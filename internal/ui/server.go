package ui

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shuntnet/shunt/internal/flows"
)

// Source delivers flows to each, oldest first: those it already holds, then
// new ones as they come, until ctx ends or it fails. The agents of a lab
// (cmd/shunt) are one; a relay of a cluster's agents can be another.
type Source interface {
	Flows(ctx context.Context, each func(flows.Flow)) error
}

// SourceFunc adapts a function to Source.
type SourceFunc func(ctx context.Context, each func(flows.Flow)) error

// Flows calls f.
func (f SourceFunc) Flows(ctx context.Context, each func(flows.Flow)) error { return f(ctx, each) }

//go:embed web
var web embed.FS

// Options configure a Server.
type Options struct {
	// History is how many flows the server keeps for views that start or
	// change their filter (default 20000).
	History int
	// Interval is the time between two snapshots of a view (default and
	// minimum 250 ms: at most 4 a second).
	Interval time.Duration
	Limits   Limits
	// Token, when set, must come with every request (?token= once, then
	// the cookie it sets). NewServer makes one up when empty.
	Token string
	// Host is a name or address besides the loopback ones that requests
	// may be addressed to: the one --listen gives, when not loopback; "*"
	// any (listening on every address: the token still guards).
	Host string
	Log  *slog.Logger
}

// MinInterval bounds how often a browser receives a snapshot.
const MinInterval = 250 * time.Millisecond

// maxViews bounds the browser tabs served at once (each aggregates every
// flow for itself).
const maxViews = 16

// Server serves the page and its views.
type Server struct {
	src     Source
	opts    Options
	history *flows.History
	mu      sync.Mutex
	views   map[string]*view
	srcErr  atomic.Value // string: the source's last error, "" while it delivers
}

type view struct {
	agg *Aggregate
}

// NewServer serves the flows of src.
func NewServer(src Source, opts Options) *Server {
	if opts.History <= 0 {
		opts.History = 20000
	}
	if opts.Interval < MinInterval {
		opts.Interval = MinInterval
	}
	if opts.Token == "" {
		b := make([]byte, 16)
		rand.Read(b)
		opts.Token = hex.EncodeToString(b)
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	s := &Server{src: src, opts: opts, history: flows.NewHistory(opts.History), views: map[string]*view{}}
	s.srcErr.Store("")
	return s
}

// Token is what a browser must present (the URL `shunt ui` prints has it).
func (s *Server) Token() string { return s.opts.Token }

// Run moves the source's flows into the server's history until ctx ends,
// starting the source again a second after it fails.
func (s *Server) Run(ctx context.Context) {
	for ctx.Err() == nil {
		err := s.src.Flows(ctx, func(fl flows.Flow) {
			s.srcErr.Store("")
			s.history.Add(fl)
		})
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			err = fmt.Errorf("the flow stream ended")
		}
		s.srcErr.Store(err.Error())
		s.opts.Log.Warn("flow source", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// Handler serves the page (/), the views' snapshots as Server-Sent Events
// (/api/events?FILTER) and an edge's recent flows (/api/edge?view=&edge=).
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(web, "web")
	mux.Handle("GET /", http.FileServer(http.FS(static)))
	mux.HandleFunc("GET /api/events", s.handleEvents)
	mux.HandleFunc("GET /api/edge", s.handleEdge)
	return s.guard(mux)
}

// guard lets through only requests for a loopback host name (a page of
// another site that resolves its name to 127.0.0.1, DNS rebinding, is
// refused) that carry the token; the token in the URL sets a cookie and is
// dropped from the address bar.
func (s *Server) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, err := net.SplitHostPort(r.Host)
		if err != nil {
			host = r.Host
		}
		if !loopbackName(host) && !s.allowedHost(host) {
			http.Error(w, "shunt ui answers only requests addressed to the address it listens on", http.StatusForbidden)
			return
		}
		if t := r.URL.Query().Get("token"); t != "" {
			if !s.tokenOK(t) {
				http.Error(w, "wrong token: use the URL `shunt ui` printed", http.StatusForbidden)
				return
			}
			http.SetCookie(w, &http.Cookie{Name: "shunt_ui", Value: t, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
			q := r.URL.Query()
			q.Del("token")
			u := *r.URL
			u.RawQuery = q.Encode()
			http.Redirect(w, r, u.String(), http.StatusSeeOther)
			return
		}
		c, err := r.Cookie("shunt_ui")
		if err != nil || !s.tokenOK(c.Value) {
			http.Error(w, "no token: open the URL `shunt ui` printed (it carries ?token=)", http.StatusUnauthorized)
			return
		}
		w.Header().Set("X-Frame-Options", "DENY")
		w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'self' 'unsafe-inline'")
		next.ServeHTTP(w, r)
	})
}

func (s *Server) tokenOK(t string) bool {
	return subtle.ConstantTimeCompare([]byte(t), []byte(s.opts.Token)) == 1
}

func (s *Server) allowedHost(host string) bool {
	return s.opts.Host == "*" || s.opts.Host != "" && host == s.opts.Host
}

func loopbackName(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// qualify reads a filter as `shunt observe` takes it: bare pod names are in
// the namespace parameter's namespace (default: default).
func qualify(q url.Values) url.Values {
	q2 := url.Values{}
	for k, v := range q {
		if v[0] != "" && k != "view" {
			q2[k] = v
		}
	}
	ns := q2.Get("namespace")
	qualified := false
	for _, k := range []string{"pod", "from-pod", "to-pod"} {
		p := q2.Get(k)
		if p == "" {
			continue
		}
		qualified = true
		if !strings.Contains(p, "/") {
			if ns == "" {
				p = "default/" + p
			} else {
				p = ns + "/" + p
			}
			q2.Set(k, p)
		}
	}
	if qualified {
		q2.Del("namespace") // it qualified the pod names
	}
	return q2
}

// handleEvents streams a view: the aggregate of the flows its filter
// selects, as a snapshot at most every Interval (only when something
// changed, and every 5 s anyway so that idle edges fade).
func (s *Server) handleEvents(w http.ResponseWriter, r *http.Request) {
	filter, err := flows.ParseFilter(qualify(r.URL.Query()))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	id, v, err := s.addView()
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	defer s.removeView(id)
	past, live, cancel := s.history.Follow(filter, 0, 65536)
	defer cancel()
	for i := range past {
		v.agg.Add(&past[i])
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	fmt.Fprintf(w, "event: view\ndata: %s\n\n", id)
	flusher.Flush()
	ticker := time.NewTicker(s.opts.Interval)
	defer ticker.Stop()
	var sent uint64 = ^uint64(0)
	lastSent := time.Time{}
	for {
		select {
		case <-r.Context().Done():
			return
		case fl := <-live:
			v.agg.Add(&fl)
		case now := <-ticker.C:
			ver := v.agg.Version()
			if ver == sent && now.Sub(lastSent) < 5*time.Second {
				continue
			}
			snap := v.agg.Snapshot(now)
			msg := struct {
				Snapshot
				Missed uint64 `json:"missed"` // flows views lost by falling behind
				Source string `json:"source"` // the source's last error
			}{snap, s.history.Dropped(), s.srcErr.Load().(string)}
			data, err := json.Marshal(msg)
			if err != nil {
				return
			}
			if _, err := fmt.Fprintf(w, "event: snapshot\ndata: %s\n\n", data); err != nil {
				return
			}
			flusher.Flush()
			sent, lastSent = ver, now
		}
	}
}

func (s *Server) addView() (string, *view, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.views) >= maxViews {
		return "", nil, fmt.Errorf("%d views open already: close a tab of the page", maxViews)
	}
	b := make([]byte, 8)
	rand.Read(b)
	id := hex.EncodeToString(b)
	v := &view{agg: NewAggregate(s.opts.Limits)}
	s.views[id] = v
	return id, v, nil
}

func (s *Server) removeView(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.views, id)
}

// handleEdge answers an edge's recent flows, newest first.
func (s *Server) handleEdge(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	s.mu.Lock()
	v := s.views[q.Get("view")]
	s.mu.Unlock()
	if v == nil {
		http.Error(w, "no such view (the page reconnected): click the edge again", http.StatusNotFound)
		return
	}
	fls, ok := v.agg.EdgeFlows(q.Get("edge"))
	if !ok {
		http.Error(w, "no such edge in this view", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	json.NewEncoder(w).Encode(struct {
		Edge  string       `json:"edge"`
		Flows []flows.Flow `json:"flows"`
	}{q.Get("edge"), fls})
}
