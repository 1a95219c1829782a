package api

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"reflect"
	"strconv"
	"strings"
)

// bodyError is a request body parseJSON refused. Its message is the
// one the caller is told (code invalid_json): it names the body's JSON
// path ("metadata.a", "allow[0]") and the kind of JSON value expected,
// and never a Go type or struct name.
type bodyError struct{ msg string }

func (e *bodyError) Error() string { return e.msg }

// errEmptyBody is the refusal of a body with no JSON value.
var errEmptyBody = &bodyError{"empty body; expected a JSON object"}

// parseJSON decodes data, one JSON value, into v: the one JSON rule of
// every request body (native routes, E2B's, code runs, template
// builds, MCP messages). Trailing data is refused, and so is an object
// that names a key twice (at any depth: {"timeout":5,"timeout":6}, a
// metadata key given twice): encoding/json would keep the last
// silently, and a client, a proxy or an audit reader that keeps the
// first would see another request than the one the server acted on.
// With strict, fields v does not have are refused too (native routes);
// E2B's routes tolerate them, as the SDK adds fields over time. Every
// refusal is a *bodyError, its message written by bodyMessage (the one
// translation of decoder errors, so that no Go type reaches a caller).
func parseJSON(data []byte, v any, strict bool) error {
	if len(bytes.TrimSpace(data)) == 0 {
		return errEmptyBody
	}
	if err := noDuplicateKeys(data); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if strict {
		dec.DisallowUnknownFields()
	}
	if err := dec.Decode(v); err != nil {
		return &bodyError{bodyMessage(data, reflect.TypeOf(v), err)}
	}
	end := dec.InputOffset()
	if _, err := dec.Token(); err != io.EOF {
		rest := len(data[end:]) - len(bytes.TrimLeft(data[end:], " \t\r\n"))
		return &bodyError{fmt.Sprintf("unexpected data after the JSON value at byte %d", end+int64(rest)+1)}
	}
	return nil
}

// bodyMessage is the caller's message for err, the error of decoding
// data into a value of type t: a syntax error with its byte (counted
// from 1), a value of the wrong kind or out of range with its field's
// JSON path, an unknown field with its path. An error it does not know
// gets a message without its text, which could name Go types.
func bodyMessage(data []byte, t reflect.Type, err error) string {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return fmt.Sprintf("syntax error at byte %d: %s", se.Offset, se.Error())
	case errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Sprintf("syntax error at byte %d: unexpected end of JSON input", len(data))
	case errors.As(err, &te):
		path := valuePathAt(data, te.Offset)
		if path == "" && te.Field != "" {
			path = te.Field // the decoder's path lacks map keys and indexes
		}
		msg := kindMessage(te)
		if path == "" {
			return msg
		}
		return fmt.Sprintf("field %q: %s", path, msg)
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		if key, uerr := strconv.Unquote(name); uerr == nil {
			if path := unknownFieldPath(data, t, key); path != "" {
				return fmt.Sprintf("unknown field %q", path)
			}
			return fmt.Sprintf("unknown field %q", key)
		}
	}
	return "the JSON value does not have the form this request takes"
}

// kindMessage says what is wrong with the value of te: a number that
// does not fit its field, or a value of another kind than expected.
func kindMessage(te *json.UnmarshalTypeError) string {
	want := jsonKind(te.Type)
	got, lit, isNum := te.Value, "", false
	if n, ok := strings.CutPrefix(te.Value, "number "); ok {
		got, lit, isNum = "number", n, true
	}
	if isNum && want == "a number" {
		if k := deref(te.Type).Kind(); k >= reflect.Int && k <= reflect.Uintptr && !integral(lit) {
			return "expected an integer, got " + lit
		}
		return lit + " is out of range"
	}
	return fmt.Sprintf("expected %s, got %s", want, withArticle(got))
}

// integral reports whether the JSON number lit is a whole number.
func integral(lit string) bool {
	f, ok := new(big.Float).SetString(lit)
	return ok && f.IsInt()
}

// withArticle names a JSON kind as the decoder reports it ("string",
// "bool") for a message ("a string", "true or false").
func withArticle(kind string) string {
	switch kind {
	case "bool":
		return "a boolean"
	case "array", "object":
		return "an " + kind
	}
	return "a " + kind
}

// textUnmarshaler is the interface of types a JSON string decodes into.
var textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()

// deref is t without its pointers.
func deref(t reflect.Type) reflect.Type {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t
}

// jsonKind is the kind of JSON value that decodes into t.
func jsonKind(t reflect.Type) string {
	t = deref(t)
	if t == nil {
		return "a JSON value"
	}
	if reflect.PointerTo(t).Implements(textUnmarshaler) {
		return "a string"
	}
	switch t.Kind() {
	case reflect.Bool:
		return "a boolean"
	case reflect.String:
		return "a string"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			return "a base64 string"
		}
		return "an array"
	case reflect.Array:
		return "an array"
	case reflect.Map, reflect.Struct:
		return "an object"
	}
	return "another kind of JSON value"
}

// noDuplicateKeys refuses data when an object in it names a key twice;
// a syntax error is left to the decoder.
func noDuplicateKeys(data []byte) error {
	if dup, err := walkJSON(data, nil); err == nil && dup != "" {
		return &bodyError{fmt.Sprintf("key %q is given twice in one object", dup)}
	}
	return nil
}

// pathSeg is one step of a JSON path: an object's key or an array's
// index.
type pathSeg struct {
	key     string
	index   int // when isIndex
	isIndex bool
}

// formatPath writes a path as messages name it: keys joined by dots,
// indexes in brackets ("rs[1].cpu").
func formatPath(p []pathSeg) string {
	var b strings.Builder
	for _, s := range p {
		if s.isIndex {
			fmt.Fprintf(&b, "[%d]", s.index)
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(s.key)
	}
	return b.String()
}

// jsonFrame is an object or an array walkJSON is inside.
type jsonFrame struct {
	keys    map[string]bool // the object's keys so far; nil for an array
	seg     pathSeg         // the step to the value being read
	wantKey bool            // the next token is a key or the closing brace
}

// walkJSON reads the tokens of data, calling visit (when not nil) for
// every value, at its first token (a literal, '{' or '['), with the
// value's path and the input offset after that token; visit returning
// false ends the walk. It returns the path of the first key an object
// names twice ("metadata.a" for key a of the object under metadata), or
// "", and a syntax error, for the decoder to report.
func walkJSON(data []byte, visit func(path []pathSeg, end int64) bool) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var stack []*jsonFrame
	path := func() []pathSeg {
		p := make([]pathSeg, len(stack))
		for i, f := range stack {
			p[i] = f.seg
		}
		return p
	}
	// done marks the innermost frame's value as read.
	done := func() {
		if n := len(stack); n > 0 {
			if top := stack[n-1]; top.keys != nil {
				top.wantKey = true
			} else {
				top.seg.index++
			}
		}
	}
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return "", nil
		}
		if err != nil {
			return "", err
		}
		n := len(stack)
		if n > 0 && stack[n-1].keys != nil && stack[n-1].wantKey {
			top := stack[n-1]
			if tok == json.Delim('}') {
				stack = stack[:n-1]
				done()
				continue
			}
			k, _ := tok.(string)
			if top.keys[k] {
				return formatPath(append(path()[:n-1], pathSeg{key: k})), nil
			}
			top.keys[k], top.seg, top.wantKey = true, pathSeg{key: k}, false
			continue
		}
		if tok == json.Delim(']') {
			stack = stack[:n-1]
			done()
			continue
		}
		if visit != nil && !visit(path(), dec.InputOffset()) {
			return "", nil
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &jsonFrame{keys: map[string]bool{}, wantKey: true})
		case json.Delim('['):
			stack = append(stack, &jsonFrame{seg: pathSeg{isIndex: true}})
		default:
			done()
		}
	}
}

// valuePathAt is the path of the value of data whose first token ends
// at offset end (where the decoder reports a value of the wrong kind),
// or "".
func valuePathAt(data []byte, end int64) string {
	var found string
	_, _ = walkJSON(data, func(p []pathSeg, off int64) bool {
		if off == end {
			found = formatPath(p)
			return false
		}
		return off < end
	})
	return found
}

// unknownFieldPath is the path of the first key named key of data that
// is in an object decoding into a struct of t without that field, or
// "".
func unknownFieldPath(data []byte, t reflect.Type, key string) string {
	var found string
	_, _ = walkJSON(data, func(p []pathSeg, _ int64) bool {
		if n := len(p); n > 0 && !p[n-1].isIndex && p[n-1].key == key {
			if st := typeAt(t, p[:n-1]); st != nil && st.Kind() == reflect.Struct {
				if _, ok := structField(st, key); !ok {
					found = formatPath(p)
					return false
				}
			}
		}
		return true
	})
	return found
}

// jsonUnmarshaler is the interface of types that decode themselves.
var jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()

// typeAt is the type (without pointers) the value at path p of a value
// of type t decodes into, or nil when no type is known there (an
// interface, a type that decodes itself, a path the type lacks).
func typeAt(t reflect.Type, p []pathSeg) reflect.Type {
	for _, s := range p {
		t = deref(t)
		if t == nil || t.Kind() == reflect.Interface || reflect.PointerTo(t).Implements(jsonUnmarshaler) {
			return nil
		}
		switch {
		case t.Kind() == reflect.Struct && !s.isIndex:
			f, ok := structField(t, s.key)
			if !ok {
				return nil
			}
			t = f.Type
		case t.Kind() == reflect.Map && !s.isIndex:
			t = t.Elem()
		case (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) && s.isIndex:
			t = t.Elem()
		default:
			return nil
		}
	}
	t = deref(t)
	if t == nil || reflect.PointerTo(t).Implements(jsonUnmarshaler) {
		return nil
	}
	return t
}

// structField is the field of struct t that the JSON key decodes into,
// as encoding/json matches them: the field's JSON name, or failing that
// one equal to key under case folding; fields of embedded structs
// count.
func structField(t reflect.Type, key string) (reflect.StructField, bool) {
	var folded *reflect.StructField
	for _, f := range reflect.VisibleFields(t) {
		if !f.IsExported() && !f.Anonymous {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if f.Anonymous && name == "" && deref(f.Type).Kind() == reflect.Struct {
			continue // its fields are visible themselves
		}
		if name == "" {
			name = f.Name
		}
		if name == key {
			return f, true
		}
		if folded == nil && strings.EqualFold(name, key) {
			folded = &f
		}
	}
	if folded != nil {
		return *folded, true
	}
	return reflect.StructField{}, false
}
