package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// uiArtifacts is where the UI tests save their screenshots:
// $SHUNT_TEST_ARTIFACTS, else a directory under the system's temporary one
// (kept: the test logs its path).
func uiArtifacts(t *testing.T) string {
	dir := os.Getenv("SHUNT_TEST_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "shunt-test-artifacts")
	}
	dir = filepath.Join(dir, t.Name())
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// startUI runs `shunt ui` for the lab on a free loopback port and returns
// the URL it printed (with its token); the process is stopped by its PID
// when the test ends.
func (l *lab) startUI(t *testing.T) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "shunt"), "--instance", l.instance, "ui", "--listen", "127.0.0.1:0")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("shunt ui stderr:\n%s", stderr.String())
		}
	})
	urls := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if u := regexp.MustCompile(`http://\S+`).FindString(sc.Text()); u != "" {
				urls <- u
			}
		}
	}()
	select {
	case u := <-urls:
		return u
	case <-time.After(10 * time.Second):
		t.Fatalf("shunt ui printed no URL in 10 s; stderr:\n%s", stderr.String())
		return ""
	}
}

// newBrowser starts Debian's chromium headless. As root it needs
// --no-sandbox: Chromium refuses to run its sandbox as root.
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	if _, err := exec.LookPath("chromium"); err != nil {
		t.Fatal("chromium is not installed: run scripts/setup.sh")
	}
	// Chromium's singleton directory (org.chromium.Chromium.*) goes to
	// TMPDIR and stays when the browser is killed, as chromedp ends it:
	// in the test's own directory, removed after the browser.
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath("chromium"), chromedp.NoSandbox, chromedp.WindowSize(1500, 950), chromedp.Env("TMPDIR="+t.TempDir()))
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(alloc)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting chromium: %v", err)
	}
	return ctx
}

// waitJS evaluates a JavaScript expression every 50 ms until it is true
// and returns how long that took; it fails the test after timeout.
func waitJS(t *testing.T, ctx context.Context, what, expr string, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool]("!!("+expr+")"))
		if err != nil {
			t.Fatalf("%s: evaluating %s: %v", what, expr, err)
		}
		if ok {
			return time.Since(start)
		}
		if time.Since(start) > timeout {
			state, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`JSON.stringify((window.shuntUI.last||{}).edges||[]).slice(0, 3000)`))
			t.Fatalf("%s: not within %s (%s); the page's edges: %s", what, timeout, expr, state)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func screenshot(t *testing.T, ctx context.Context, dir, name string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", p)
}

// clickEdge clicks an edge of the map (the handler is on the edge's group).
func clickEdge(t *testing.T, ctx context.Context, id string) {
	t.Helper()
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[chromedp.Void](edgeSel(id)+`.dispatchEvent(new MouseEvent('click'))`)); err != nil {
		t.Fatalf("clicking edge %s: %v", id, err)
	}
}

func edgeSel(id string) string { return fmt.Sprintf(`document.querySelector('[data-edge=%q]')`, id) }

// TestUIServiceMap drives `shunt ui` in headless Chromium over the demo's
// application (examples/demo with its policy, and examples/l7's split and
// HTTP policy): the map shows the workloads, Services and edges; a
// connection a deny rule drops turns its edge red within 2 s and its flow
// list names the rule; an HTTP request the proxy refuses marks its edge
// HTTP-denied; the reviews route's 90/10 split reads 90/10 on its two
// edges; a filter narrows the map.
func TestUIServiceMap(t *testing.T) {
	l := newLabWith(t, nil, "../../examples/demo/", "../../examples/policy/", "../../examples/l7/")
	shuntBin := filepath.Join(binDir, "shunt")
	podShunt := func(ns, pod string, args ...string) (string, int) {
		return l.shunt(append([]string{"lab", "exec", "-n", ns, pod, "--", shuntBin, "lab"}, args...)...)
	}
	mustExec := func(ns, pod string, args ...string) string {
		t.Helper()
		out, code := podShunt(ns, pod, args...)
		if code != 0 {
			t.Fatalf("%s/%s: shunt lab %s: exit %d:\n%s", ns, pod, strings.Join(args, " "), code, out)
		}
		return out
	}
	jsonField := func(path string, args ...string) string {
		t.Helper()
		var obj map[string]any
		if err := json.Unmarshal([]byte(l.mustShunt(append([]string{"get"}, append(args, "-o", "json")...)...)), &obj); err != nil {
			t.Fatal(err)
		}
		var v any = obj
		for _, k := range strings.Split(path, ".") {
			v, _ = v.(map[string]any)[k]
		}
		s, _ := v.(string)
		if s == "" {
			t.Fatalf("get %v: no %s", args, path)
		}
		return s
	}
	svcIP := func(ns, name string) string { return jsonField("spec.clusterIP", "svc", "-n", ns, name) }
	backendVIP, reviewsVIP, l7BackendVIP := svcIP("shop", "backend"), svcIP("default", "reviews"), svcIP("default", "backend")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if out, _ := l.shunt("proxy", "status"); strings.HasPrefix(out, "healthy") {
			break
		}
		if time.Now().After(deadline) {
			out, _ := l.shunt("proxy", "status")
			t.Fatalf("node proxy not healthy in 10 s: %s", out)
		}
	}

	url := l.startUI(t)
	ctx := newBrowser(t)
	dir := uiArtifacts(t)
	if err := chromedp.Do(ctx, chromedp.Navigate(url)); err != nil {
		t.Fatalf("loading %s: %v", url, err)
	}
	waitJS(t, ctx, "the page's first snapshot", `window.shuntUI && window.shuntUI.snapshots > 0`, 5*time.Second)

	// Allowed traffic: the shop's frontend to its backend's ClusterIP,
	// monitoring's scraper to the shop's frontend over HTTP.
	mustExec("shop", "frontend", "probe", "--timeout", "2s", "--tcp", backendVIP+":9000", "--count", "4")
	shopFrontendIP := jsonField("status.podIP", "pods", "-n", "shop", "frontend")
	mustExec("monitoring", "scraper", "probe", "--timeout", "2s", "--http", "http://"+shopFrontendIP+"/")
	for _, id := range []string{"w:shop/frontend", "svc:shop/backend", "w:monitoring/scraper"} {
		waitJS(t, ctx, "node "+id, fmt.Sprintf(`document.querySelector('[data-node=%q]')`, id), 5*time.Second)
	}
	waitJS(t, ctx, "frontend > backend Service, forwarded", edgeSel("w:shop/frontend > svc:shop/backend")+`?.dataset.state == 'forwarded'`, 5*time.Second)
	waitJS(t, ctx, "backend Service > a backend version",
		`document.querySelector('[data-edge="svc:shop/backend > w:shop/backend-v1"], [data-edge="svc:shop/backend > w:shop/backend-v2"]')`, 5*time.Second)
	scraperEdge := "w:monitoring/scraper > w:shop/frontend"
	waitJS(t, ctx, "scraper > frontend, forwarded", edgeSel(scraperEdge)+`?.dataset.state == 'forwarded'`, 5*time.Second)
	screenshot(t, ctx, dir, "1-map.png")

	// A connection the deny rule drops (no-monitoring-admin: monitoring may
	// not reach the frontend's port 8443): the edge turns red within 2 s.
	start := time.Now()
	probeDone := make(chan string, 1)
	go func() {
		out, code := podShunt("monitoring", "scraper", "probe", "--timeout", "500ms", "--expect", "timeout", "--tcp", shopFrontendIP+":8443")
		if code != 0 {
			out = fmt.Sprintf("exit %d: %s", code, out)
		} else {
			out = ""
		}
		probeDone <- out
	}()
	waitJS(t, ctx, "scraper > frontend turns red", edgeSel(scraperEdge)+`?.dataset.state == 'dropped'`, 3*time.Second)
	red := time.Since(start)
	if out := <-probeDone; out != "" {
		t.Fatalf("the denied probe: %s", out)
	}
	t.Logf("the denied connection's edge turned red %s after the probe started", red.Round(time.Millisecond))
	if red > 2*time.Second {
		t.Errorf("the edge turned red after %s, want within 2 s", red)
	}
	clickEdge(t, ctx, scraperEdge)
	waitJS(t, ctx, "the edge's flows name the deny rule and the reason",
		`[...document.querySelectorAll('#edge-flows tbody tr.DROPPED')].some(r => r.textContent.includes('ShuntNetworkPolicy shop/no-monitoring-admin') && r.textContent.includes('policy-denied'))`, 3*time.Second)
	screenshot(t, ctx, dir, "2-denied-edge.png")

	// An HTTP request the backend's HTTP policy refuses (frontend may only
	// GET /metrics): the proxy answers 403, the edge is HTTP-denied.
	if out, _ := l.shunt("lab", "exec", "frontend", "--", shuntBin, "lab", "http-get", "http://"+l7BackendVIP+":8080/admin"); !strings.HasPrefix(out, "403") {
		t.Fatalf("GET /admin from frontend: %s, want 403", out)
	}
	httpEdge := "w:default/frontend > svc:default/backend"
	waitJS(t, ctx, "frontend > backend HTTP-denied", edgeSel(httpEdge)+`?.dataset.state == 'http-denied'`, 3*time.Second)
	clickEdge(t, ctx, httpEdge)
	waitJS(t, ctx, "the refused request's flow: 403 and the policy",
		`[...document.querySelectorAll('#edge-flows tbody tr.DROPPED')].some(r => r.textContent.includes('GET /admin → 403') && r.textContent.includes('default/backend-http'))`, 3*time.Second)

	// The reviews route's 90/10 split, read off the map as the share of
	// the Service's requests on its two edges.
	if out, _ := l.shunt("lab", "exec", "frontend", "--", shuntBin, "lab", "http-load", "--url", "http://"+reviewsVIP+":9080/", "-n", "1000", "-c", "1"); !strings.Contains(out, `"200":1000`) {
		t.Fatalf("1000 requests to reviews: %s", out)
	}
	v1, v2 := "svc:default/reviews > w:default/reviews-v1", "svc:default/reviews > w:default/reviews-v2"
	for _, id := range []string{"svc:default/reviews", "w:default/reviews-v1", "w:default/reviews-v2"} {
		waitJS(t, ctx, "node "+id, fmt.Sprintf(`document.querySelector('[data-node=%q]')`, id), 5*time.Second)
	}
	waitJS(t, ctx, "1000 requests counted on the split's edges",
		`(window.shuntUI.last.edges.filter(e => e.from == 'svc:default/reviews').reduce((n, e) => n + e.requests, 0)) >= 1000`, 5*time.Second)
	waitJS(t, ctx, "the split's shares drawn", edgeSel(v1)+`?.dataset.share && `+edgeSel(v2)+`?.dataset.share`, 2*time.Second)
	shares, err := chromedp.Run(ctx, chromedp.Evaluate[[]float64](fmt.Sprintf(`[%s.dataset.share, %s.dataset.share].map(Number)`, edgeSel(v1), edgeSel(v2))))
	if err != nil {
		t.Fatal(err)
	}
	label, _ := chromedp.Run(ctx, chromedp.Evaluate[string](edgeSel(v1)+`.querySelector('text').textContent`))
	t.Logf("split on the map: reviews-v1 %.1f%%, reviews-v2 %.1f%% (label %q)", shares[0], shares[1], label)
	if math.Abs(shares[0]-90) > 3 || math.Abs(shares[1]-10) > 3 {
		t.Errorf("split reads %.1f/%.1f, want 90/10 ± 3", shares[0], shares[1])
	}
	if !strings.Contains(label, "%") {
		t.Errorf("the v1 edge's label %q shows no share", label)
	}
	clickEdge(t, ctx, v1)
	waitJS(t, ctx, "the split edge's flows show route and backend",
		`[...document.querySelectorAll('#edge-flows tbody tr')].some(r => r.textContent.includes('route default/reviews') && r.textContent.includes('backend default/reviews-v1'))`, 3*time.Second)
	screenshot(t, ctx, dir, "3-split.png")

	// Filters as in observe: namespace monitoring leaves the scraper's
	// edges only; then verdict DROPPED only the drop.
	if err := chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS("#close")),
		chromedp.SetValue(chromedp.CSS(`#filter [name=namespace]`), "monitoring"),
		chromedp.Click(chromedp.CSS(`#filter button[type=submit]`)),
	); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, "namespace filter narrows to monitoring",
		`(() => { const e = [...document.querySelectorAll('[data-edge]')]; return e.length > 0 && e.every(x => x.dataset.edge.includes('w:monitoring/')) && !document.querySelector('[data-node="w:default/frontend"]') })()`, 5*time.Second)
	screenshot(t, ctx, dir, "4-filter-namespace.png")
	if err := chromedp.Do(ctx,
		chromedp.SetValue(chromedp.CSS(`#filter [name=verdict]`), "DROPPED"),
		chromedp.Click(chromedp.CSS(`#filter button[type=submit]`)),
	); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, "namespace + verdict filter leaves the drop",
		`(() => { const e = [...document.querySelectorAll('[data-edge]')]; return e.length > 0 && e.every(x => x.dataset.state == 'dropped') && e.some(x => x.dataset.edge == '`+scraperEdge+`') })()`, 5*time.Second)
	q, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`location.search`))
	if !strings.Contains(q, "namespace=monitoring") || !strings.Contains(q, "verdict=DROPPED") {
		t.Errorf("the page's address does not keep the filter: %q", q)
	}
	screenshot(t, ctx, dir, "5-filter-dropped.png")
}
