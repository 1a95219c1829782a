package api

import (
	"encoding/json"
	"testing"
	"time"
)

// TestParseJSONPaths pins what the routes' types do not reach of the
// JSON rule's messages (TestBadInputRefused sends the rest through every
// route): fields of embedded structs, by value and by pointer, are
// fields; a map of structs and an array of arrays are walked by key and
// index; a field tagged "-" is unknown; unknown fields under a raw JSON
// value are the route's to check; an error of a type that decodes
// itself gets a message without its text.
func TestParseJSONPaths(t *testing.T) {
	type inner struct {
		Deep int `json:"deep"`
	}
	type Base struct {
		Name string `json:"name"`
	}
	type Extra struct {
		Note string `json:"note"`
	}
	type body struct {
		Base
		*Extra
		Secret string             `json:"-"`
		Items  map[string]inner   `json:"items"`
		Grid   [][]inner          `json:"grid"`
		Raw    json.RawMessage    `json:"raw"`
		At     time.Time          `json:"at"`
		Any    map[string]any     `json:"any"`
		Ptrs   map[string]*inner  `json:"ptrs"`
		Arr    [2]float32         `json:"arr"`
		Flags  map[string][]bool  `json:"flags"`
		Nested struct{ In inner } `json:"nested"`
	}
	for _, c := range []struct{ in, msg string }{
		{`{"name":"a","note":"b","items":{"k":{"deep":1}},"raw":{"whatever":1},"any":{"x":[1,{"y":2}]}}`, ""},
		{`{"name":5}`, `field "name": expected a string, got a number`},
		{`{"note":5}`, `field "note": expected a string, got a number`},
		{`{"Secret":"x"}`, `unknown field "Secret"`},
		{`{"items":{"k":{"nope":1}}}`, `unknown field "items.k.nope"`},
		{`{"items":{"k":{"deep":"x"}}}`, `field "items.k.deep": expected a number, got a string`},
		{`{"ptrs":{"k":{"deep":1.5}}}`, `field "ptrs.k.deep": expected an integer, got 1.5`},
		{`{"grid":[[],[{"deep":1},{"nope":1}]]}`, `unknown field "grid[1][1].nope"`},
		{`{"grid":[[],[{"deep":1},{"deep":true}]]}`, `field "grid[1][1].deep": expected a number, got a boolean`},
		{`{"arr":[1,1e39]}`, `field "arr[1]": 1e39 is out of range`},
		{`{"flags":{"a":[true,"no"]}}`, `field "flags.a[1]": expected a boolean, got a string`},
		{`{"nested":{"In":{"nope":1}}}`, `unknown field "nested.In.nope"`},
		{`{"nested":{"in":{"deep":{}}}}`, `field "nested.in.deep": expected a number, got an object`},
		{`{"raw":{"a":1,"a":2}}`, `key "raw.a" is given twice in one object`},
		{`{"at":"x"}`, "the JSON value does not have the form this request takes"},
	} {
		var v body
		err := parseJSON([]byte(c.in), &v, true)
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != c.msg {
			t.Errorf("%s: %q, want %q", c.in, got, c.msg)
		}
	}
}
