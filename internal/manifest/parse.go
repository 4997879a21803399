package manifest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/shuntnet/shunt/internal/parallel"
)

// ShuntAPIVersion is the apiVersion of shunt's own kinds.
const ShuntAPIVersion = "shunt.io/v1alpha1"

// Parse parses one stream: multi-document YAML, or one or more JSON
// objects, including "kind: List" documents whose items are expanded. The
// objects are decoded strictly and defaulted (namespace "default", protocol
// TCP, Service targetPort = port, ...). source names the stream in Object.Source
// and in errors. Parse does not validate the objects; Validate (and Load) do.
// On error it returns a *Errors listing every document that failed.
func Parse(source string, data []byte) ([]Object, error) {
	var errs Errors
	objs := decodeAll(splitDocuments(source, data, &errs), &errs, false)
	if err := errs.orNil(); err != nil {
		return nil, err
	}
	return objs, nil
}

// Document is one document of a manifest stream converted to JSON, named
// "file#N" (N counts the file's non-empty documents from 1). This is what
// a client sends the agent, which decodes and validates it (Decode).
type Document struct {
	Source string
	JSON   []byte
}

// Decode decodes documents strictly into typed, defaulted objects (see
// Parse), a List into its items. It does not validate them.
func Decode(docs []Document) ([]Object, error) {
	var errs Errors
	objs := decodeAll(docs, &errs, false)
	if err := errs.orNil(); err != nil {
		return nil, err
	}
	return objs, nil
}

// DecodeReferences decodes what a delete needs of each document: its
// apiVersion, kind and metadata (strictly, as Decode does), a List into its
// items. Nothing else of a document is read, as kubectl delete -f reads
// nothing else: a manifest naming only apiVersion, kind, metadata.name and
// metadata.namespace deletes its object, and so does a complete manifest
// whose spec this version would refuse (a field it does not know, a value
// it does not accept). The objects have only TypeMeta and ObjectMeta set,
// the namespace defaulted; CheckReferences checks them.
func DecodeReferences(docs []Document) ([]Object, error) {
	var errs Errors
	objs := decodeAll(docs, &errs, true)
	if err := errs.orNil(); err != nil {
		return nil, err
	}
	return objs, nil
}

// decodeAll decodes documents on every CPU (tens of thousands of documents
// are common, one Service and one EndpointSlice per service, and each takes
// tens of microseconds), keeping their order and the
// order of their problems in errs; objects that decoded are returned even
// when others did not, so Load can still validate them. With refsOnly,
// only apiVersion, kind and metadata are decoded (DecodeReferences).
func decodeAll(docs []Document, errs *Errors, refsOnly bool) []Object {
	objs := make([][]Object, len(docs))
	problems := make([]Errors, len(docs))
	parallel.For(len(docs), func(i int) {
		objs[i] = decodeDocument(docs[i].Source, docs[i].JSON, &problems[i], refsOnly)
	})
	var out []Object
	for i := range docs {
		out = append(out, objs[i]...)
		errs.List = append(errs.List, problems[i].List...)
	}
	return out
}

// splitDocuments splits a stream into its non-empty documents, converted
// to JSON and named source#N. Documents holding only comments, whitespace
// or null are dropped and not counted, so "#2" always means the second
// real document of the file. Syntax errors go to errs.
func splitDocuments(source string, data []byte, errs *Errors) []Document {
	var out []Document
	for i, doc := range documents(data) {
		// A document that is not YAML keeps its number but has nothing to decode.
		src := source + "#" + strconv.Itoa(i+1)
		if doc.err != nil {
			errs.add(src, "", "", "%v", doc.err)
			continue
		}
		out = append(out, Document{Source: src, JSON: doc.json})
	}
	return out
}

// document is one document of a stream, converted to JSON.
type document struct {
	json []byte
	err  error // the document is not valid YAML/JSON
}

// documents splits a stream into its non-empty documents, converting YAML
// ones to JSON on every CPU.
func documents(data []byte) []document {
	data = bytes.TrimPrefix(data, []byte("\xef\xbb\xbf")) // editors on Windows add a BOM
	if trimmed := bytes.TrimLeft(data, " \t\r\n"); len(trimmed) > 0 && trimmed[0] == '{' {
		if docs, ok := jsonDocuments(data); ok {
			return docs
		}
		// "{apiVersion: v1, ...}" is YAML flow style, not JSON.
	}
	chunks := splitYAML(data)
	converted := make([]document, len(chunks))
	parallel.For(len(chunks), func(i int) {
		// YAMLToJSONStrict rejects duplicate keys, which plain YAML
		// decoding would silently resolve to the last one.
		j, err := yaml.YAMLToJSONStrict(chunks[i].data)
		if err != nil {
			converted[i] = document{err: fmt.Errorf("not valid YAML: %s", yamlMessage(err, chunks[i].line-1))}
		} else if !isNull(j) {
			converted[i] = document{json: j}
		}
	})
	var docs []document
	for _, d := range converted {
		if d.err != nil || d.json != nil {
			docs = append(docs, d)
		}
	}
	return docs
}

// jsonDocuments decodes a stream of JSON values. It reports !ok when the
// first value is not JSON at all, so the caller can try YAML instead.
func jsonDocuments(data []byte) (docs []document, ok bool) {
	dec := json.NewDecoder(bytes.NewReader(data))
	for {
		var raw json.RawMessage
		err := dec.Decode(&raw)
		if errors.Is(err, io.EOF) {
			return docs, true
		}
		if err != nil {
			if len(docs) == 0 {
				return nil, false
			}
			// The stream cannot be resynchronised after a syntax error.
			return append(docs, document{err: fmt.Errorf("not valid JSON: %v", err)}), true
		}
		if !isNull(raw) {
			docs = append(docs, document{json: raw})
		}
	}
}

// yamlLine matches the parser's line numbers, which count from the start
// of the document.
var yamlLine = regexp.MustCompile(`\bline (\d+)\b`)

// yamlMessage makes a YAML error one line without the parser's prefixes,
// with line numbers counted from the top of the file (the document starts
// after lineOffset lines): "line 8: key "name" already set in map".
func yamlMessage(err error, lineOffset int) string {
	msg := yamlLine.ReplaceAllStringFunc(err.Error(), func(m string) string {
		n, _ := strconv.Atoi(strings.TrimPrefix(m, "line "))
		return "line " + strconv.Itoa(n+lineOffset)
	})
	for _, prefix := range []string{"error converting YAML to JSON: ", "yaml: ", "unmarshal errors:"} {
		msg = strings.TrimPrefix(msg, prefix)
	}
	var lines []string
	for _, l := range strings.Split(msg, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "; ")
}

func isNull(j []byte) bool {
	j = bytes.TrimSpace(j)
	return len(j) == 0 || string(j) == "null"
}

// yamlChunk is the text of one YAML document and the file line it starts on.
type yamlChunk struct {
	line int
	data []byte
}

// splitYAML splits a stream at document markers: lines that are "---"
// (optionally followed by a space and content, which then belongs to the
// new document) or "..." (end of document).
func splitYAML(data []byte) []yamlChunk {
	var chunks []yamlChunk
	cur := yamlChunk{line: 1}
	lineNo := 0
	for len(data) > 0 {
		lineNo++
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i+1], data[i+1:]
		} else {
			data = nil
		}
		text := strings.TrimRight(string(line), "\r\n")
		switch {
		case text == "---" || strings.HasPrefix(text, "--- ") || strings.HasPrefix(text, "---\t"):
			chunks = append(chunks, cur)
			// Keep the rest of the marker line ("--- # comment", "--- {a: 1}")
			// as the first line of the new document, blanking the marker so
			// columns in error messages stay right.
			cur = yamlChunk{line: lineNo, data: append([]byte("   "), line[3:]...)}
		case text == "..." || strings.HasPrefix(text, "... "):
			chunks = append(chunks, cur)
			cur = yamlChunk{line: lineNo + 1}
		default:
			cur.data = append(cur.data, line...)
		}
	}
	return append(chunks, cur)
}

// decodeDocument decodes one JSON document into typed objects (several for
// a List), reporting problems to errs. With refsOnly it decodes only
// apiVersion, kind and metadata, and does not default.
func decodeDocument(src string, raw []byte, errs *Errors, refsOnly bool) []Object {
	// An empty document is possible here: an API request may name a
	// document without its object.
	if raw = bytes.TrimSpace(raw); len(raw) == 0 || raw[0] != '{' {
		errs.add(src, "", "", "a manifest must be a mapping with apiVersion and kind, not %s", jsonValueKind(raw))
		return nil
	}
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   any    `json:"metadata"` // for naming the object in errors, leniently
	}
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(raw, &head); err != nil {
		field, msg := describeDecodeError(err)
		errs.add(src, "", field, "%s", msg)
		return nil
	}
	if head.Kind == "List" {
		return decodeList(src, raw, errs, refsOnly)
	}
	ns, name := namespaceName(head.Metadata)
	info, ok := kindByName[head.Kind]
	if !ok {
		if head.Kind == "" {
			errs.add(src, "", "kind", "required: one of %s", supportedKinds())
		} else {
			errs.add(src, objectLabel(head.Kind, ns, name), "kind", "unknown kind %q: supported kinds are %s", head.Kind, supportedKinds())
		}
		return nil
	}
	if info.namespaced && ns == "" {
		ns = metav1.NamespaceDefault
	}
	label := objectLabel(info.kind, ns, name)
	if head.APIVersion != info.apiVersion {
		if head.APIVersion == "" {
			errs.add(src, label, "apiVersion", "required: %s is %q", info.kind, info.apiVersion)
		} else {
			errs.add(src, label, "apiVersion", "%q is not supported for %s: use %q", head.APIVersion, info.kind, info.apiVersion)
		}
		return nil
	}
	if refsOnly {
		var ok bool
		if raw, ok = referenceOf(src, label, raw, errs); !ok {
			return nil
		}
	}
	obj := info.newObj()
	if !decodeStrict(src, label, raw, obj, errs) {
		return nil
	}
	// The API server fills these in; doing the same means consumers see
	// the values a real cluster would store.
	if m := obj.(metav1.Object); info.namespaced && m.GetNamespace() == "" {
		m.SetNamespace(metav1.NamespaceDefault)
	}
	if !refsOnly {
		info.defaults(obj)
	}
	return []Object{{Source: src, Obj: obj}}
}

// referenceOf keeps of a document only apiVersion, kind and metadata, the
// fields that name its object.
func referenceOf(src, label string, raw []byte, errs *Errors) ([]byte, bool) {
	var doc map[string]json.RawMessage
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(raw, &doc); err != nil {
		field, msg := describeDecodeError(err)
		errs.add(src, label, field, "%s", msg)
		return nil, false
	}
	ref := make(map[string]json.RawMessage, 3)
	for _, k := range []string{"apiVersion", "kind", "metadata"} {
		if v, ok := doc[k]; ok {
			ref[k] = v
		}
	}
	out, err := json.Marshal(ref)
	if err != nil {
		errs.add(src, label, "", "%v", err)
		return nil, false
	}
	return out, true
}

// decodeList expands a v1 List into its items.
func decodeList(src string, raw []byte, errs *Errors, refsOnly bool) []Object {
	var list struct {
		metav1.TypeMeta `json:",inline"`
		Metadata        metav1.ListMeta   `json:"metadata"`
		Items           []json.RawMessage `json:"items"`
	}
	if !decodeStrict(src, "List", raw, &list, errs) {
		return nil
	}
	if list.APIVersion != "v1" {
		errs.add(src, "List", "apiVersion", "%q is not supported for List: use \"v1\"", list.APIVersion)
		return nil
	}
	var out []Object
	for i, item := range list.Items {
		itemSrc := fmt.Sprintf("%s items[%d]", src, i)
		if isNull(item) {
			errs.add(itemSrc, "", "", "must not be null")
			continue
		}
		var head struct {
			Kind string `json:"kind"`
		}
		if json.Unmarshal(item, &head) == nil && head.Kind == "List" {
			errs.add(itemSrc, "", "kind", "a List cannot contain another List")
			continue
		}
		out = append(out, decodeDocument(itemSrc, item, errs, refsOnly)...)
	}
	return out
}

// decodeStrict decodes raw into obj like the API server does: field names
// are case-sensitive, and unknown or duplicate fields are errors, each
// reported with its full path (spec.containers[0].comand).
func decodeStrict(src, label string, raw []byte, obj any, errs *Errors) bool {
	strictErrs, err := sigsjson.UnmarshalStrict(raw, obj, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
	if err != nil {
		field, msg := describeDecodeError(err)
		errs.add(src, label, field, "%s", msg)
		return false
	}
	for _, e := range strictErrs {
		var fe sigsjson.FieldError
		if errors.As(e, &fe) {
			// The error reads `unknown field "path"`: keep the words, move the path.
			errs.add(src, label, fe.FieldPath(), "%s", strings.TrimSuffix(e.Error(), " "+strconv.Quote(fe.FieldPath())))
		} else {
			errs.add(src, label, "", "%v", e)
		}
	}
	return len(strictErrs) == 0
}

// describeDecodeError turns a JSON type error into a field path and a
// message that speaks of YAML/JSON values rather than Go types.
func describeDecodeError(err error) (field, msg string) {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		// The path has no list indices ("spec.containers.ports.containerPort"),
		// but it still points at the right field.
		msg := fmt.Sprintf("got %s, want %s", te.Value, describeType(te.Type))
		if te.Value == "bool" && te.Type != nil && te.Type.Kind() == reflect.String {
			msg += ` (quote it: YAML reads y, n, yes, no, on and off as booleans)`
		}
		return te.Field, msg
	}
	return "", strings.TrimPrefix(err.Error(), "json: ")
}

func describeType(t reflect.Type) string {
	if t == nil {
		return "another type"
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer (" + t.Kind().String() + ")"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "a list"
	case reflect.Map, reflect.Struct:
		return "a mapping"
	}
	return t.String()
}

func jsonValueKind(raw []byte) string {
	if len(raw) == 0 {
		return "an empty document"
	}
	switch raw[0] {
	case '[':
		return "a list"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	default:
		return "a number"
	}
}

// namespaceName digs namespace and name out of a decoded metadata value
// leniently: a broken document just stays unnamed.
func namespaceName(metadata any) (ns, name string) {
	m, _ := metadata.(map[string]any)
	ns, _ = m["namespace"].(string)
	name, _ = m["name"].(string)
	return ns, name
}
