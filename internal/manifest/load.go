package manifest

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// StdinSource is the source name of objects read from stdin ("-").
const StdinSource = "<stdin>"

// Load reads manifests from files, directories and "-" (stdin), parses them
// (see Parse) and validates the whole set (see Validate). Every problem in
// every file is reported in one *Errors.
func Load(paths []string, stdin io.Reader) ([]Object, error) {
	var errs Errors
	docs := readDocuments(paths, stdin, &errs)
	objs := decodeAll(docs, &errs, false)
	// Validate what did parse too, so one run shows every problem.
	if err := Validate(objs); err != nil {
		errs.List = append(errs.List, err.(*Errors).List...)
	}
	if err := errs.orNil(); err != nil {
		return nil, err
	}
	return objs, nil
}

// ReadDocuments reads manifests from files, directories and "-" (stdin)
// and splits them into documents converted to JSON, without decoding them:
// what a client does before sending them to the agent, which decodes and
// validates (Decode, Validate). Directories are walked recursively for
// *.yaml, *.yml and *.json files, in lexical order within each directory;
// a file named explicitly is read whatever its extension. Unreadable files
// and syntax errors are reported together in one *Errors.
func ReadDocuments(paths []string, stdin io.Reader) ([]Document, error) {
	var errs Errors
	docs := readDocuments(paths, stdin, &errs)
	if err := errs.orNil(); err != nil {
		return nil, err
	}
	return docs, nil
}

func readDocuments(paths []string, stdin io.Reader, errs *Errors) []Document {
	var docs []Document
	readStdin := false
	for _, p := range paths {
		files, err := expand(p)
		if err != nil {
			errs.add(p, "", "", "%v", err)
			continue
		}
		for _, f := range files {
			source, data, err := f, []byte(nil), error(nil)
			switch {
			case f != "-":
				data, err = os.ReadFile(f)
			case readStdin:
				source, err = StdinSource, errors.New(`"-" (stdin) given more than once`)
			case stdin == nil:
				source, err = StdinSource, errors.New("no stdin to read")
			default:
				readStdin, source = true, StdinSource
				data, err = io.ReadAll(stdin)
			}
			if err != nil {
				errs.add(source, "", "", "cannot read: %v", unwrapPath(err))
				continue
			}
			docs = append(docs, splitDocuments(source, data, errs)...)
		}
	}
	return docs
}

// expand turns a path into the manifest files it names.
func expand(p string) ([]string, error) {
	if p == "-" {
		return []string{p}, nil
	}
	st, err := os.Stat(p)
	if err != nil {
		return nil, unwrapPath(err)
	}
	if !st.IsDir() {
		return []string{p}, nil
	}
	var files []string
	// WalkDir visits entries in lexical order, so the result is sorted
	// directory by directory, like "ls -R".
	err = filepath.WalkDir(p, func(f string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		switch filepath.Ext(f) {
		case ".yaml", ".yml", ".json":
			files = append(files, f)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, errors.New("directory has no *.yaml, *.yml or *.json files")
	}
	return files, nil
}

// unwrapPath drops the path from an *fs.PathError: the error is reported
// next to the path already.
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
