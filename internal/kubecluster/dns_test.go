package kubecluster

import "testing"

// kube-dns is at the service CIDR's tenth address, as kubeadm puts it.
func TestDNSServiceIP(t *testing.T) {
	for cidr, want := range map[string]string{"10.96.0.0/16": "10.96.0.10", "10.198.0.0/16": "10.198.0.10", "10.150.7.0/24": "10.150.7.10", "10.96.5.3/16": "10.96.0.10"} {
		if got, err := DNSServiceIP(cidr); err != nil || got.String() != want {
			t.Errorf("DNSServiceIP(%s) = %v, %v; want %s", cidr, got, err, want)
		}
	}
	for _, cidr := range []string{"10.96.0.0/29", "not a cidr"} {
		if got, err := DNSServiceIP(cidr); err == nil {
			t.Errorf("DNSServiceIP(%s) = %v, want an error", cidr, got)
		}
	}
}
