// Command image builds shunt's container image without a container daemon
// (go-containerregistry): shuntd, shunt, shunt-cni, shunt-proxy and
// shunt-install-cni, static, in one layer on no base image, written as an
// OCI image layout and as a docker-archive tarball. Reproducible: every
// timestamp is the commit's, the tar is sorted with fixed owners and modes,
// the binaries are built with -trimpath, so the same commit gives the same
// digest (image_test.go builds twice and compares).
//
// It is a module of its own so that shunt's go.mod does not carry
// go-containerregistry. `make image` runs it:
//
//	cd tools/image && GOWORK=off go run . -repo ../.. -out ../../bin/image
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"time"
)

func main() {
	repo := flag.String("repo", "../..", "the shunt checkout to build from")
	out := flag.String("out", "../../bin/image", "write DIR/oci (OCI image layout) and DIR/shunt.tar (docker archive) here")
	arch := flag.String("arch", runtime.GOARCH, "GOARCH of the image")
	tag := flag.String("tag", "ghcr.io/shuntnet/shunt:dev", "the name the docker archive and the layout's ref.name carry")
	flag.Parse()
	start := time.Now()
	abs, err := filepath.Abs(*out)
	if err == nil {
		var r *Result
		r, err = Build(Options{Repo: *repo, Arch: *arch, Tag: *tag,
			Layout: filepath.Join(abs, "oci"), Tar: filepath.Join(abs, "shunt.tar")})
		if err == nil {
			report(r, abs, time.Since(start))
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func report(r *Result, out string, took time.Duration) {
	m, _ := r.Image.Manifest()
	var compressed int64
	for _, l := range m.Layers {
		compressed += l.Size
	}
	names := make([]string, 0, len(r.Binaries))
	for n := range r.Binaries {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintf(os.Stderr, "image: revision %s, created %s, built in %s\n", r.Source.Revision, r.Source.Time.Format(time.RFC3339), took.Round(100*time.Millisecond))
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "image:   %s%s %.1f MB\n", BinDir+"/", n, float64(r.Binaries[n])/1e6)
	}
	fmt.Fprintf(os.Stderr, "image: layer %.1f MB compressed; %s/oci (OCI layout), %s/shunt.tar (docker load -i)\n", float64(compressed)/1e6, out, out)
	// The digest alone on stdout, for scripts (helm --set image.digest=...).
	fmt.Println(r.Digest)
}
