package dpinfo

import (
	"strings"
	"testing"
)

func TestParseFallbacks(t *testing.T) {
	f, err := ParseFallbacks("tc, sock-diag")
	if err != nil || !f.Has(FallbackTC) || !f.Has(FallbackSockDiag) || f.Has(FallbackSkMsgAttach) {
		t.Fatalf("got %v, %v", f, err)
	}
	if f, err := ParseFallbacks("all"); err != nil || len(f.List()) != len(AllFallbacks) {
		t.Fatalf("all: got %v, %v", f, err)
	}
	if f, err := ParseFallbacks(""); err != nil || len(f.List()) != 0 {
		t.Fatalf("empty: got %v, %v", f, err)
	}
	if _, err := ParseFallbacks("tcx"); err == nil || !strings.Contains(err.Error(), "sock-diag") {
		t.Fatalf("an unknown name must be refused with the known ones listed: %v", err)
	}
}

func TestKernelReportLine(t *testing.T) {
	r := KernelReport{Release: "6.1.0-28-amd64", Taken: []string{"tc", "skmsg-attach", "sock-diag", "dsr-no-gso-decap"}, Forced: []string{"sock-diag"}}
	want := "6.1.0-28-amd64; tcx: no → tc clsact; sockmap link: no → BPF_PROG_ATTACH; sock_destroy: forced off → sock_diag destroy; set_retval: yes; " +
		"DSR GSO decap: no → GSO packets arriving by DSR dropped (dsr-gso-decap)"
	if got := r.Line(); got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}
