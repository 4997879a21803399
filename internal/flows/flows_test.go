package flows

import (
	"encoding/json"
	"fmt"
	"net/url"
	"reflect"
	"strings"
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

// TestJSONFieldsNamesWhatIsEmitted: every key of a flow with every field
// set, nested ones included, is in JSONFields (the list `shunt observe -h`
// prints), and JSONFields names nothing else.
func TestJSONFieldsNamesWhatIsEmitted(t *testing.T) {
	var fl Flow
	fill(reflect.ValueOf(&fl).Elem())
	b, err := json.Marshal(fl)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	emitted := map[string]bool{}
	var keys func(prefix string, m map[string]any)
	keys = func(prefix string, m map[string]any) {
		for k, v := range m {
			emitted[prefix+k] = true
			if sub, ok := v.(map[string]any); ok {
				keys(prefix+k+".", sub)
			}
		}
	}
	keys("", m)

	listed := map[string]bool{}
	spelt := map[string][]string{} // "{a,b}" by the field that spelt it out
	var last []string
	for _, f := range strings.Split(JSONFields(), ", ") {
		name, sub, nested := strings.Cut(f, "{")
		listed[name] = true
		if !nested {
			continue
		}
		subs := strings.Split(strings.TrimSuffix(sub, "}"), ",")
		if sub == "...}" {
			subs = last // the type spelt out just before: destination after source
		} else {
			last = subs
			spelt[name] = subs
		}
		for _, s := range subs {
			listed[name+"."+s] = true
		}
	}
	for k := range emitted {
		if !listed[k] {
			t.Errorf("%s is emitted but not in JSONFields %q", k, JSONFields())
		}
	}
	for k := range listed {
		if !emitted[k] {
			t.Errorf("JSONFields names %s, which a flow with every field set does not emit", k)
		}
	}
	if len(spelt) < 3 {
		t.Errorf("JSONFields %q spells out fewer objects than source, service and http", JSONFields())
	}
}

// fill sets every field of v to a non-zero value, so omitempty leaves none out.
func fill(v reflect.Value) {
	switch v.Kind() {
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[time.Time]() {
			v.Set(reflect.ValueOf(time.Unix(1, 0)))
			return
		}
		for i := range v.NumField() {
			fill(v.Field(i))
		}
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem())
	case reflect.String:
		v.SetString("x")
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		fill(v.Index(0))
	case reflect.Int, reflect.Int64:
		v.SetInt(1)
	case reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(1)
	default:
		panic("fill: no value for " + v.Type().String())
	}
}
