package lab

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
)

// Images from OCI image layouts: a container whose image is in one of the
// layouts the node is given (Images.Layouts, e.g. bin/image/oci of `make
// image`) runs from that image's file system, as a container runtime runs
// it: the layers unpacked once per image digest into a root file system,
// the process chrooted there in a mount namespace of its own with the
// pod's volumes bind-mounted (volumes.go), the image's entrypoint, command
// and environment. No registry: the layout stands for the registry, and the
// image reference is matched against the names its index carries.

// imageCacheDir holds the unpacked images, one directory per manifest
// digest, as a runtime's content store does; it is the node's image cache,
// not shunt's: removing a node's agent leaves it, as `helm uninstall`
// leaves a node's images.
var imageCacheDir = "/var/cache/shunt-lab/images"

// ociImage is one image found in a layout.
type ociImage struct {
	layout   string // the layout directory
	manifest ociDescriptor
	config   ociConfig
	layers   []ociDescriptor
}

type ociDescriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// ociConfig is what of an image's configuration a runtime applies.
type ociConfig struct {
	Config struct {
		Entrypoint []string `json:"Entrypoint"`
		Cmd        []string `json:"Cmd"`
		Env        []string `json:"Env"`
		WorkingDir string   `json:"WorkingDir"`
	} `json:"config"`
}

// blobPath is where a layout keeps the blob of a digest.
func blobPath(layout, digest string) (string, error) {
	alg, hexsum, ok := strings.Cut(digest, ":")
	if !ok || alg != "sha256" || len(hexsum) != 64 {
		return "", fmt.Errorf("digest %q: only sha256 digests are read", digest)
	}
	return filepath.Join(layout, "blobs", alg, hexsum), nil
}

func readBlobJSON(layout, digest string, v any) error {
	p, err := blobPath(layout, digest)
	if err != nil {
		return err
	}
	data, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	if sum := sha256.Sum256(data); "sha256:"+hex.EncodeToString(sum[:]) != digest {
		return fmt.Errorf("blob %s of layout %s does not match its digest", digest, layout)
	}
	return json.Unmarshal(data, v)
}

// refMatches says whether an index entry is the image a reference names:
// by digest (name@sha256:...), by full name (io.containerd.image.name,
// "docker.io/library/" completed), or by repository's last element and tag
// against the layout's org.opencontainers.image.ref.name.
func refMatches(ref string, d ociDescriptor) bool {
	name, digest, hasDigest := strings.Cut(ref, "@")
	if hasDigest {
		return d.Digest == digest
	}
	tag := "latest"
	if i := strings.LastIndexByte(name, ':'); i > strings.LastIndexByte(name, '/') {
		name, tag = name[:i], name[i+1:]
	}
	if full := d.Annotations["io.containerd.image.name"]; full != "" {
		repo, fullTag, _ := strings.Cut(full[strings.LastIndexByte(full, '/')+1:], ":")
		fullRepo := full[:strings.LastIndexByte(full, '/')+1] + repo
		if fullTag == tag && (fullRepo == name || strings.TrimPrefix(fullRepo, "docker.io/library/") == name || strings.TrimPrefix(fullRepo, "docker.io/") == name) {
			return true
		}
		return false
	}
	return d.Annotations["org.opencontainers.image.ref.name"] == tag
}

// findLayoutImage looks the reference up in the layouts; nil when none has it.
func findLayoutImage(layouts []string, ref string) (*ociImage, error) {
	for _, layout := range layouts {
		var index struct {
			Manifests []ociDescriptor `json:"manifests"`
		}
		data, err := os.ReadFile(filepath.Join(layout, "index.json"))
		if err != nil {
			return nil, fmt.Errorf("image layout %s: %w (build it with `make image`)", layout, err)
		}
		if err := json.Unmarshal(data, &index); err != nil {
			return nil, fmt.Errorf("image layout %s: index.json: %w", layout, err)
		}
		for _, m := range index.Manifests {
			if !refMatches(ref, m) {
				continue
			}
			var manifest struct {
				Config ociDescriptor   `json:"config"`
				Layers []ociDescriptor `json:"layers"`
			}
			if err := readBlobJSON(layout, m.Digest, &manifest); err != nil {
				return nil, fmt.Errorf("image %s in layout %s: manifest: %w", ref, layout, err)
			}
			img := &ociImage{layout: layout, manifest: m, layers: manifest.Layers}
			if err := readBlobJSON(layout, manifest.Config.Digest, &img.config); err != nil {
				return nil, fmt.Errorf("image %s in layout %s: config: %w", ref, layout, err)
			}
			return img, nil
		}
	}
	return nil, nil
}

// unpackMu serialises unpacking: two pods of one image unpack it once.
var unpackMu sync.Mutex

// rootfs unpacks the image's layers (once per manifest digest) and returns
// its root file system.
func (img *ociImage) rootfs() (string, error) {
	_, hexsum, _ := strings.Cut(img.manifest.Digest, ":")
	dir := filepath.Join(imageCacheDir, hexsum)
	root := filepath.Join(dir, "rootfs")
	unpackMu.Lock()
	defer unpackMu.Unlock()
	if _, err := os.Stat(root); err == nil {
		return root, nil
	}
	// Unpacked aside and renamed into place: another node's kubelet on
	// this machine may unpack the same image at the same time; the first
	// rename wins, the other's copy goes.
	if err := os.MkdirAll(imageCacheDir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(imageCacheDir, hexsum[:12]+".unpacking-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Join(tmp, "rootfs"), 0o755); err != nil {
		return "", err
	}
	for _, l := range img.layers {
		if err := unpackLayer(img.layout, l, filepath.Join(tmp, "rootfs")); err != nil {
			return "", fmt.Errorf("unpacking layer %s of image %s: %w", l.Digest, img.manifest.Digest, err)
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		if _, serr := os.Stat(root); serr == nil {
			return root, nil // unpacked by another kubelet meanwhile
		}
		return "", err
	}
	return root, nil
}

// unpackLayer extracts one layer tar (gzip or not) into root: regular
// files, directories and links, with OCI whiteouts applied. Every path is
// kept below root.
func unpackLayer(layout string, l ociDescriptor, root string) error {
	p, err := blobPath(layout, l.Digest)
	if err != nil {
		return err
	}
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(l.MediaType, "+gzip") || strings.HasSuffix(l.MediaType, ".gzip") {
		gz, err := gzip.NewReader(f)
		if err != nil {
			return err
		}
		defer gz.Close()
		r = gz
	}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := path.Clean("/" + h.Name)
		if name == "/" {
			continue
		}
		target := filepath.Join(root, name)
		base := path.Base(name)
		if strings.HasPrefix(base, ".wh.") {
			if base == ".wh..wh..opq" {
				entries, _ := os.ReadDir(filepath.Dir(target))
				for _, e := range entries {
					os.RemoveAll(filepath.Join(filepath.Dir(target), e.Name()))
				}
			} else {
				os.RemoveAll(filepath.Join(filepath.Dir(target), strings.TrimPrefix(base, ".wh.")))
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		mode := os.FileMode(h.Mode) & os.ModePerm
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, mode); err != nil {
				return err
			}
			if err := os.Chmod(target, mode|stickyOf(h.Mode)); err != nil {
				return err
			}
		case tar.TypeReg:
			os.RemoveAll(target)
			out, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
			if err != nil {
				return err
			}
			_, err = io.Copy(out, tr)
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		case tar.TypeSymlink:
			os.RemoveAll(target)
			if err := os.Symlink(h.Linkname, target); err != nil {
				return err
			}
		case tar.TypeLink:
			os.RemoveAll(target)
			if err := os.Link(filepath.Join(root, path.Clean("/"+h.Linkname)), target); err != nil {
				return err
			}
		default:
			// Devices and FIFOs: the container gets the node's /dev.
		}
		os.Lchown(target, h.Uid, h.Gid)
	}
}

func stickyOf(mode int64) os.FileMode {
	if mode&0o1000 != 0 {
		return os.ModeSticky
	}
	return 0
}

// imageArgv is the process of a container of img: the runtime's rule
// (command replaces the entrypoint and the image's arguments, args the
// image's arguments).
func (img *ociImage) argv(command, args []string) []string {
	c := img.config.Config
	switch {
	case len(command) > 0:
		return append(append([]string{}, command...), args...)
	case len(args) > 0:
		return append(append([]string{}, c.Entrypoint...), args...)
	}
	return append(append([]string{}, c.Entrypoint...), c.Cmd...)
}

// imagePath is the PATH the image's configuration sets (the default a
// runtime uses when it sets none).
func (img *ociImage) imagePath() string {
	for _, e := range img.config.Config.Env {
		if v, ok := strings.CutPrefix(e, "PATH="); ok {
			return v
		}
	}
	return "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
}
