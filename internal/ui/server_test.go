package ui

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/shuntnet/shunt/internal/flows"
)

// flood is a source that sends flows as fast as it can until ctx ends.
func flood(ctx context.Context, each func(flows.Flow)) error {
	for i := 0; ctx.Err() == nil; i++ {
		verdict := "FORWARDED"
		if i%100 == 0 {
			verdict = "DROPPED"
		}
		each(flows.Flow{Time: time.Now(), Verdict: verdict, Protocol: "TCP",
			Source: flows.Endpoint{Pod: fmt.Sprintf("ns%d/client-%d", i%3, i%7), Namespace: fmt.Sprintf("ns%d", i%3),
				Labels: []string{fmt.Sprintf("app=client%d", i%7)}},
			Destination: flows.Endpoint{Pod: "ns0/server", Namespace: "ns0"}})
		if i%100 == 0 {
			time.Sleep(time.Millisecond) // let the test's reader run on a small machine
		}
	}
	return nil
}

// TestServerBoundsWhatTheBrowserGets: under a flood of flows a view gets
// at most one snapshot per interval, a filter narrows it, and nothing is
// served without the token or to a host name that is not loopback.
func TestServerBoundsWhatTheBrowserGets(t *testing.T) {
	srv := NewServer(SourceFunc(flood), Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go srv.Run(ctx)
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()

	resp, err := http.Get(hs.URL + "/api/events")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("without the token: %s, want 401", resp.Status)
	}
	req, _ := http.NewRequest("GET", hs.URL+"/?token="+srv.Token(), nil)
	req.Host = "evil.example:80"
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("addressed to another host name: %s, want 403", resp.Status)
	}

	jar, _ := cookiejar.New(nil)
	client := &http.Client{Jar: jar}
	resp, err = client.Get(hs.URL + "/?token=" + srv.Token())
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the page with the token: %s", resp.Status)
	}

	count := func(query string) (snapshots int, last Snapshot, view string) {
		t.Helper()
		rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
		defer rcancel()
		req, _ := http.NewRequestWithContext(rctx, "GET", hs.URL+"/api/events?"+query, nil)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("events: %s", resp.Status)
		}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		event := ""
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "event: "):
				event = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: ") && event == "view":
				view = strings.TrimPrefix(line, "data: ")
			case strings.HasPrefix(line, "data: ") && event == "snapshot":
				snapshots++
				last = Snapshot{}
				if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &last); err != nil {
					t.Fatal(err)
				}
			}
		}
		return snapshots, last, view
	}
	n, last, _ := count("")
	if n == 0 || n > 8 {
		t.Errorf("%d snapshots in 2 s, want 1..8 (at most one per %s)", n, MinInterval)
	}
	if last.Flows < 1000 {
		t.Errorf("the last snapshot counted %d flows: the source did not flood", last.Flows)
	}
	if len(last.Edges) != 21 {
		t.Errorf("%d edges, want 21 (3 namespaces' client0..6 > server)", len(last.Edges))
	}
	t.Logf("%d snapshots for %d flows", n, last.Flows)

	_, narrowed, _ := count("namespace=ns1&verdict=FORWARDED")
	for _, e := range narrowed.Edges {
		if !strings.HasPrefix(e.From, "w:ns1/") || e.Dropped != 0 {
			t.Errorf("filtered view has edge %+v", e)
		}
	}
	if len(narrowed.Edges) == 0 {
		t.Error("filtered view is empty")
	}
	resp, err = client.Get(hs.URL + "/api/events?verdict=MAYBE")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("a bad filter: %s, want 400", resp.Status)
	}
}

// TestGuardHosts: loopback names always, the --listen host when given, any
// host when listening on every address; the token in every case.
func TestGuardHosts(t *testing.T) {
	for _, c := range []struct {
		allowed, host string
		want          int
	}{
		{"", "127.0.0.1:7480", http.StatusOK},
		{"", "localhost:7480", http.StatusOK},
		{"", "[::1]:7480", http.StatusOK},
		{"", "192.0.2.1:7480", http.StatusForbidden},
		{"192.0.2.1", "192.0.2.1:7480", http.StatusOK},
		{"192.0.2.1", "attacker.example:7480", http.StatusForbidden},
		{"*", "attacker.example:7480", http.StatusOK},
	} {
		srv := NewServer(SourceFunc(func(ctx context.Context, _ func(flows.Flow)) error { <-ctx.Done(); return nil }), Options{Host: c.allowed})
		req := httptest.NewRequest("GET", "/", nil)
		req.Host = c.host
		req.AddCookie(&http.Cookie{Name: "shunt_ui", Value: srv.Token()})
		w := httptest.NewRecorder()
		srv.Handler().ServeHTTP(w, req)
		if w.Code != c.want {
			t.Errorf("listening for %q, request to %s: %d, want %d", c.allowed, c.host, w.Code, c.want)
		}
		req = httptest.NewRequest("GET", "/", nil)
		req.Host = c.host
		req.AddCookie(&http.Cookie{Name: "shunt_ui", Value: "not-the-token"})
		w = httptest.NewRecorder()
		srv.Handler().ServeHTTP(w, req)
		if w.Code == http.StatusOK {
			t.Errorf("listening for %q, request to %s with a wrong token: 200", c.allowed, c.host)
		}
	}
}
