package lab

import (
	"fmt"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// The lab runs no container images: a container's process is a program of
// the node. Two kinds of image name say which:
//
//   - Images shunt maps, the ones the Kubernetes conformance suites run
//     (MappedImages): agnhost built from its upstream source at the pinned
//     Kubernetes release (scripts/kube-build.sh agnhost), pause (agnhost's
//     pause), busybox (Debian's busybox-static), glibc-dns-testing
//     (Debian 12 with dig: the node's own programs), coredns (CoreDNS
//     built from its module, tools/coredns), and the Gateway API's
//     echo-advanced (Istio's echo app, built from its module,
//     tools/istioecho). They run as their image
//     would: the image's entrypoint and default arguments, the pod's command
//     and args over them as a runtime applies them, and the paths of the
//     image's programs (/agnhost, /bin/sh, ...) mapped to the node's.
//   - Lab images: a name with no registry host ("lab", "debian:12",
//     "shunt/labserver"), with a command. The image is a label; command and
//     args run as the node's programs, as the lab always has.
//
// Any other image (a registry's image shunt does not map, or a lab image
// with no command) is refused: its pod stays Pending with the waiting
// reason ImageNotMapped naming the image, as a kubelet leaves a pod whose
// image it cannot pull. Nothing else runs in its place.

// ImageNotMappedReason is the waiting reason of a container whose image the
// lab cannot run.
const ImageNotMappedReason = "ImageNotMapped"

// Images says where the programs of the mapped images are.
type Images struct {
	// Agnhost is the agnhost binary; empty when it is not built (agnhost
	// and pause images are then not mapped, and say how to build it).
	Agnhost string
	// Busybox is Debian's static busybox (busybox-static: /bin/busybox);
	// empty when it is not installed.
	Busybox string
	// CoreDNS is the coredns binary (scripts/kube-build.sh coredns, from
	// tools/coredns); empty when it is not built.
	CoreDNS string
	// IstioEcho is the directory of Istio's echo app (scripts/kube-build.sh
	// istio-echo, from tools/istioecho): its server and client and the
	// certificate and key its image carries (IstioEchoFiles); empty when
	// it is not built.
	IstioEcho string
	// Layouts are OCI image layouts (`make image`'s bin/image/oci): an
	// image they hold runs from its own file system (rootfs.go).
	Layouts []string
}

// imageKind is one family of mapped images.
type imageKind int

const (
	imageAgnhost imageKind = iota + 1
	imagePause
	imageBusybox
	// imageDebian: Debian 12 with programs the node has too (setup.sh
	// installs them): its commands are the node's.
	imageDebian
	// imageCoreDNS: CoreDNS, the cluster DNS (its image's entrypoint
	// /coredns).
	imageCoreDNS
	// imageIstioEcho: Istio's echo app (gcr.io/istio-release/app, which
	// the Gateway API's echo-advanced image is): entrypoint
	// /usr/local/bin/server, /usr/local/bin/client beside it, /cert.crt
	// and /cert.key for its TLS ports.
	imageIstioEcho
)

// IstioEchoFiles are the files of Istio's echo image, by their path in
// the image, and their names in Images.IstioEcho (scripts/kube-build.sh
// istio-echo writes them; Istio's pkg/test/echo/docker/Dockerfile.app
// copies them there).
var IstioEchoFiles = map[string]string{
	"/usr/local/bin/server": "istio-echo-server",
	"/usr/local/bin/client": "istio-echo-client",
	"/cert.crt":             "istio-echo-cert.crt",
	"/cert.key":             "istio-echo-cert.key",
}

// MappedImages are the repositories (any tag or digest) the lab runs, as
// e2e.test names them (k8s.io/kubernetes/test/utils/image) and as users
// write them.
var MappedImages = map[string]imageKind{
	"registry.k8s.io/e2e-test-images/agnhost":   imageAgnhost,
	"k8s.gcr.io/e2e-test-images/agnhost":        imageAgnhost,
	"registry.k8s.io/pause":                     imagePause,
	"k8s.gcr.io/pause":                          imagePause,
	"registry.k8s.io/e2e-test-images/busybox":   imageBusybox,
	"docker.io/library/busybox":                 imageBusybox,
	"registry.k8s.io/e2e-test-images/busybox-1": imageBusybox,
	// debian:bookworm-slim with dnsutils: dig is the node's (bind9-dnsutils).
	"registry.k8s.io/e2e-test-images/glibc-dns-testing": imageDebian,
	"registry.k8s.io/coredns/coredns":                   imageCoreDNS,
	"docker.io/coredns/coredns":                         imageCoreDNS,
	// The Gateway API conformance suite's mesh echo (its mesh/manifests.yaml):
	// FROM gcr.io/istio-release/app (docker/Dockerfile.echo-advanced).
	"registry.k8s.io/gateway-api/echo-advanced": imageIstioEcho,
	"gcr.io/istio-release/app":                  imageIstioEcho,
}

// ImageNotMappedError says why an image cannot run.
type ImageNotMappedError struct {
	Image  string
	Reason string
}

func (e *ImageNotMappedError) Error() string {
	return fmt.Sprintf("image %q is not mapped to a program of this node: %s", e.Image, e.Reason)
}

// Argv is the process a container of image runs, given the pod's command
// and args: the program's path first.
func (im Images) Argv(image string, command, args []string) ([]string, error) {
	if img, err := findLayoutImage(im.Layouts, image); err != nil || img != nil {
		if err != nil {
			return nil, &ImageNotMappedError{image, err.Error()}
		}
		return img.argv(command, args), nil
	}
	repo, host := imageRepository(image)
	kind, mapped := MappedImages[repo]
	if !mapped {
		switch {
		case host != "":
			return nil, &ImageNotMappedError{image, "the lab runs only " + mappedList() + " of registries' images"}
		case len(command) == 0:
			return nil, &ImageNotMappedError{image, "a lab image (a name with no registry) needs a command: the lab runs command and args as the node's programs"}
		}
		return append(slices.Clone(command), args...), nil
	}
	switch kind {
	case imageAgnhost, imagePause:
		if im.Agnhost == "" {
			return nil, &ImageNotMappedError{image, "agnhost is not built on this node: run scripts/kube-build.sh agnhost (and give shuntd --agnhost)"}
		}
	case imageBusybox:
		if im.Busybox == "" {
			return nil, &ImageNotMappedError{image, "busybox is not installed on this node: run scripts/setup.sh (Debian's busybox-static)"}
		}
	case imageCoreDNS:
		if im.CoreDNS == "" {
			return nil, &ImageNotMappedError{image, "coredns is not built on this node: run scripts/kube-build.sh coredns"}
		}
	case imageIstioEcho:
		if im.IstioEcho == "" {
			return nil, &ImageNotMappedError{image, "Istio's echo app is not built on this node: run scripts/kube-build.sh istio-echo"}
		}
	}
	// A runtime's rule: command replaces the entrypoint (and drops the
	// image's arguments), args replace the image's arguments.
	var entrypoint, defaults []string
	switch kind {
	case imageAgnhost:
		entrypoint, defaults = []string{"/agnhost"}, []string{"pause"}
	case imagePause:
		entrypoint = []string{"/pause"}
	case imageBusybox:
		defaults = []string{"sh"}
	case imageDebian:
		defaults = []string{"bash"}
	case imageCoreDNS:
		entrypoint = []string{"/coredns"}
	case imageIstioEcho:
		entrypoint = []string{"/usr/local/bin/server"}
	}
	argv := slices.Concat(entrypoint, defaults)
	switch {
	case len(command) > 0:
		argv = slices.Concat(command, args)
	case len(args) > 0:
		argv = slices.Concat(entrypoint, args)
	}
	return im.program(kind, argv), nil
}

// program maps the image's program argv[0] to the node's.
func (im Images) program(kind imageKind, argv []string) []string {
	name := path.Base(argv[0])
	switch {
	case kind == imagePause && name == "pause":
		// The pause image's /pause waits for a signal; agnhost's pause
		// is that program. Its arguments mean nothing to it.
		return []string{im.Agnhost, "pause"}
	case kind == imageAgnhost && (name == "agnhost" || name == "agnhost-2"):
		return append([]string{im.Agnhost}, argv[1:]...)
	case kind == imageCoreDNS && name == "coredns":
		return append([]string{im.CoreDNS}, argv[1:]...)
	case kind == imageIstioEcho && (argv[0] == "server" || argv[0] == "client" || argv[0] == "/usr/local/bin/"+name):
		if file, ok := IstioEchoFiles["/usr/local/bin/"+name]; ok {
			return append([]string{filepath.Join(im.IstioEcho, file)}, argv[1:]...)
		}
	case kind == imageBusybox || (kind == imageAgnhost && im.Busybox != ""):
		// busybox's and alpine's (agnhost's base) programs are busybox
		// applets: run as `busybox APPLET ARGS`, whose shell runs
		// applets before the node's programs of the same name.
		if kind == imageBusybox || alpineApplets[argv[0]] {
			return append([]string{im.Busybox, name}, argv[1:]...)
		}
	}
	// A program the image has that is also the node's (agnhost's curl,
	// dig, ip): the node's, found on the container's PATH.
	return argv
}

// alpineApplets are the paths of agnhost's base image (alpine) that are
// busybox applets and that e2e tests run.
var alpineApplets = map[string]bool{
	"sh": true, "/bin/sh": true, "ash": true, "/bin/ash": true,
	"sleep": true, "/bin/sleep": true, "cat": true, "/bin/cat": true,
	"echo": true, "/bin/echo": true, "wget": true, "/usr/bin/wget": true,
}

// imageRepository is image without tag or digest, Docker Hub's short names
// completed (busybox -> docker.io/library/busybox), and its registry host
// ("" when the name has none: a lab image).
func imageRepository(image string) (repo, host string) {
	repo, _, _ = strings.Cut(image, "@")
	if i := strings.LastIndexByte(repo, ':'); i > strings.LastIndexByte(repo, '/') {
		repo = repo[:i]
	}
	first, rest, hasSlash := strings.Cut(repo, "/")
	if hasSlash && (strings.ContainsAny(first, ".:") || first == "localhost") {
		host = first
		if host == "index.docker.io" || host == "registry-1.docker.io" {
			host = "docker.io"
		}
		if host == "docker.io" && !strings.Contains(rest, "/") {
			rest = "library/" + rest
		}
		return host + "/" + rest, host
	}
	// Docker Hub's short names: the lab's own names have no host either,
	// so only the mapped ones are completed.
	if full := "docker.io/library/" + repo; !hasSlash && MappedImages[full] != 0 {
		return full, ""
	}
	if full := "docker.io/" + repo; hasSlash && MappedImages[full] != 0 {
		return full, ""
	}
	return repo, ""
}

func mappedList() string {
	names := make([]string, 0, len(MappedImages))
	for r := range MappedImages {
		names = append(names, r)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// imagePrograms are the paths where a mapped image has its programs, as
// an exec into its container names them (kubectl exec POD -- /agnhost
// dns-suffix): the runtime shows the node's program there
// (podfiles.go bind-mounts it).
func (im Images) imagePrograms(image string) map[string]string {
	repo, _ := imageRepository(image)
	switch MappedImages[repo] {
	case imageAgnhost:
		if im.Agnhost != "" {
			return map[string]string{"/agnhost": im.Agnhost}
		}
	case imageCoreDNS:
		if im.CoreDNS != "" {
			return map[string]string{"/coredns": im.CoreDNS}
		}
	case imageIstioEcho:
		// Its server and client where the image has them, on its PATH
		// (the Gateway API's mesh suite execs `client URL ...`), and its
		// certificate and key, which the container's arguments name
		// (--crt=/cert.crt --key=/cert.key). The mount points the node
		// lacks are made and removed with their pods (internal/mountpoint).
		if im.IstioEcho != "" {
			files := make(map[string]string, len(IstioEchoFiles))
			for at, name := range IstioEchoFiles {
				files[at] = filepath.Join(im.IstioEcho, name)
			}
			return files
		}
	}
	return nil
}
