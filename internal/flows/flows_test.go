package flows

import (
	"fmt"
	"net/url"
	"testing"
	"time"
)

func flow(i int, from, to, verdict string, port uint16) Flow {
	return Flow{Time: time.Unix(int64(i), 0), Verdict: verdict, Protocol: "TCP",
		Source:      Endpoint{Pod: from, Namespace: "default", Port: 40000},
		Destination: Endpoint{Pod: to, Namespace: "shop", Port: port}}
}

func TestFilterSelectsExactlyWhatItNames(t *testing.T) {
	fl := flow(1, "default/a", "shop/b", "DROPPED", 80)
	fl.Service = &Service{Name: "shop/web:http", IP: "10.96.0.1", Port: 8080}
	cases := []struct {
		q    string
		want bool
	}{
		{"", true},
		{"pod=default/a", true}, {"pod=shop/b", true}, {"pod=shop/c", false},
		{"from-pod=default/a", true}, {"from-pod=shop/b", false},
		{"to-pod=shop/b", true}, {"to-pod=default/a", false},
		{"namespace=shop", true}, {"namespace=kube-system", false},
		{"verdict=dropped", true}, {"verdict=FORWARDED", false},
		{"protocol=tcp", true}, {"protocol=UDP", false},
		{"port=80", true}, {"port=40000", true}, {"port=8080", true}, {"port=443", false},
		{"service=shop/web", true}, {"service=shop/we", false},
		{"since=1970-01-01T00:00:00Z", true}, {"since=2000-01-01T00:00:00Z", false},
		{"pod=default/a&verdict=FORWARDED", false},
	}
	for _, c := range cases {
		q, _ := url.ParseQuery(c.q)
		f, err := ParseFilter(q)
		if err != nil {
			t.Fatalf("%s: %v", c.q, err)
		}
		if got := f.Match(&fl); got != c.want {
			t.Errorf("%q: match %v, want %v", c.q, got, c.want)
		}
		// The filter survives its own encoding.
		back, err := ParseFilter(f.Query())
		if err != nil || back != f {
			t.Errorf("%q: round trip %+v -> %+v (%v)", c.q, f, back, err)
		}
	}
	for _, bad := range []string{"verdict=MAYBE", "protocol=GRE", "port=0", "port=x", "since=yesterday"} {
		q, _ := url.ParseQuery(bad)
		if _, err := ParseFilter(q); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestHistoryKeepsTheLastAndFollows(t *testing.T) {
	h := NewHistory(3)
	for i := 1; i <= 5; i++ {
		h.Add(flow(i, "default/a", "shop/b", "FORWARDED", uint16(i)))
	}
	got := h.Query(Filter{}, 0)
	if len(got) != 3 || got[0].Destination.Port != 3 || got[2].Destination.Port != 5 {
		t.Errorf("history %v, want ports 3..5 oldest first", ports(got))
	}
	if got := h.Query(Filter{}, 2); len(got) != 2 || got[0].Destination.Port != 4 {
		t.Errorf("last 2: %v", ports(got))
	}
	past, live, cancel := h.Follow(Filter{Verdict: "DROPPED"}, 0, 10)
	defer cancel()
	if len(past) != 0 {
		t.Errorf("no drops yet, got %v", ports(past))
	}
	h.Add(flow(6, "default/a", "shop/b", "FORWARDED", 6))
	h.Add(flow(7, "default/a", "shop/b", "DROPPED", 7))
	select {
	case fl := <-live:
		if fl.Destination.Port != 7 {
			t.Errorf("followed %d, want the drop on 7", fl.Destination.Port)
		}
	case <-time.After(time.Second):
		t.Fatal("the drop was not delivered to the follower")
	}
	// A follower that does not read loses flows; Add never blocks.
	_, _, cancel2 := h.Follow(Filter{}, 0, 1)
	defer cancel2()
	for i := 0; i < 100; i++ {
		h.Add(flow(8+i, "default/a", "shop/b", "FORWARDED", 1))
	}
	if h.Dropped() == 0 {
		t.Error("a stalled follower's misses are not counted")
	}
}

func ports(fs []Flow) string {
	var s string
	for _, f := range fs {
		s += fmt.Sprint(f.Destination.Port, " ")
	}
	return s
}

func TestFilterSelectsHTTPRecords(t *testing.T) {
	denied := flow(1, "default/a", "shop/b", "DROPPED", 8080)
	denied.Protocol = "HTTP"
	denied.HTTP = &HTTP{Method: "GET", Path: "/admin/users", Protocol: "HTTP/1.1", Status: 403}
	timedOut := flow(2, "default/a", "shop/b", "FORWARDED", 8080)
	timedOut.Protocol = "HTTP"
	timedOut.HTTP = &HTTP{Method: "POST", Path: "/api", Protocol: "HTTP/2", Error: "upstream request timeout"}
	tcp := flow(3, "default/a", "shop/b", "FORWARDED", 8080)
	cases := []struct {
		q    string
		want [3]bool // denied, timedOut, tcp
	}{
		{"protocol=http", [3]bool{true, true, false}},
		{"protocol=TCP", [3]bool{false, false, true}},
		{"http-status=403", [3]bool{true, false, false}},
		{"http-status=4xx", [3]bool{true, false, false}},
		{"http-status=5xx", [3]bool{false, false, false}},
		{"http-status=0", [3]bool{false, true, false}},
		{"http-method=post", [3]bool{false, true, false}},
		{"http-path=/admin", [3]bool{true, false, false}},
		{"http-path=/", [3]bool{true, true, false}},
		{"verdict=dropped&protocol=HTTP", [3]bool{true, false, false}},
	}
	for _, c := range cases {
		q, _ := url.ParseQuery(c.q)
		f, err := ParseFilter(q)
		if err != nil {
			t.Fatalf("%s: %v", c.q, err)
		}
		for i, fl := range []*Flow{&denied, &timedOut, &tcp} {
			if got := f.Match(fl); got != c.want[i] {
				t.Errorf("%q on flow %d: match %v, want %v", c.q, i, got, c.want[i])
			}
		}
		if back, err := ParseFilter(f.Query()); err != nil || back != f {
			t.Errorf("%q: round trip %+v -> %+v (%v)", c.q, f, back, err)
		}
	}
	for _, bad := range []string{"http-status=600", "http-status=40", "http-status=6xx", "http-status=abc", "http-path=admin"} {
		q, _ := url.ParseQuery(bad)
		if _, err := ParseFilter(q); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
