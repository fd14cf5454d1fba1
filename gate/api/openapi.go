package api

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// openAPI is the OpenAPI 3.1 description of the whole API (SPEC §6), shipped in the binary.
//
//go:embed openapi.json
var openAPI []byte

// OpenAPI returns the OpenAPI 3.1 document describing the API, as JSON.
func OpenAPI() []byte { return slices.Clone(openAPI) }

// Spec is a parsed OpenAPI document with a small JSON Schema validator for its component
// schemas: enough of JSON Schema (type, enum, properties, required, additionalProperties,
// items, bounds, pattern, date-time) to check that examples and real answers match the
// contract. Safe for concurrent use.
type Spec struct {
	doc struct {
		Paths      map[string]map[string]json.RawMessage `json:"paths"`
		Components struct {
			Schemas map[string]*schema `json:"schemas"`
		} `json:"components"`
	}
}

type schema struct {
	Ref                  string             `json:"$ref"`
	Type                 any                `json:"type"`
	Enum                 []any              `json:"enum"`
	Properties           map[string]*schema `json:"properties"`
	Required             []string           `json:"required"`
	AdditionalProperties any                `json:"additionalProperties"`
	Items                *schema            `json:"items"`
	Minimum              *float64           `json:"minimum"`
	Maximum              *float64           `json:"maximum"`
	MinLength            *int               `json:"minLength"`
	MaxLength            *int               `json:"maxLength"`
	MinItems             *int               `json:"minItems"`
	MaxItems             *int               `json:"maxItems"`
	Pattern              string             `json:"pattern"`
	Format               string             `json:"format"`
}

// ParseSpec parses an OpenAPI JSON document (OpenAPI() by default).
func ParseSpec(raw []byte) (*Spec, error) {
	s := &Spec{}
	if err := json.Unmarshal(raw, &s.doc); err != nil {
		return nil, fmt.Errorf("openapi: %w", err)
	}
	return s, nil
}

// Operations returns every described operation as "METHOD /path", sorted.
func (s *Spec) Operations() []string {
	var out []string
	for path, item := range s.doc.Paths {
		for method := range item {
			switch method {
			case "get", "put", "post", "delete", "patch", "head", "options":
				out = append(out, strings.ToUpper(method)+" "+path)
			}
		}
	}
	sort.Strings(out)
	return out
}

// Validate checks v (a decoded JSON value: map[string]any, []any, float64, string, bool, nil)
// against the component schema name and returns the first mismatch with its JSON path.
func (s *Spec) Validate(name string, v any) error {
	sc, ok := s.doc.Components.Schemas[name]
	if !ok {
		return fmt.Errorf("openapi: no schema %q", name)
	}
	return s.validate(sc, v, "$")
}

// ValidateJSON is Validate for raw JSON.
func (s *Spec) ValidateJSON(name string, raw []byte) error {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return fmt.Errorf("openapi: %w", err)
	}
	return s.Validate(name, v)
}

// CheckAnswer checks an answer of the operation method template (a path as the document writes
// it, "/v1/jobs/{id}"): the document must describe its status and, when it gives a JSON schema
// for that status, body must match it.
func (s *Spec) CheckAnswer(method, template string, status int, body []byte) error {
	raw, ok := s.doc.Paths[template][strings.ToLower(method)]
	if !ok {
		return fmt.Errorf("openapi: %s %s is not described", method, template)
	}
	var op struct {
		Responses map[string]struct {
			Content map[string]struct {
				Schema json.RawMessage `json:"schema"`
			} `json:"content"`
		} `json:"responses"`
	}
	if err := json.Unmarshal(raw, &op); err != nil {
		return fmt.Errorf("openapi: %s %s: %w", method, template, err)
	}
	resp, ok := op.Responses[strconv.Itoa(status)]
	if !ok {
		return fmt.Errorf("openapi: %s %s: status %d is not described", method, template, status)
	}
	media, ok := resp.Content["application/json"]
	if !ok {
		return nil // not JSON (/metrics)
	}
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		return fmt.Errorf("openapi: %s %s → %d: the body is not JSON: %w", method, template, status, err)
	}
	if err := s.ValidateSchema(media.Schema, v); err != nil {
		return fmt.Errorf("openapi: %s %s → %d: the answer does not match the contract: %w", method, template, status, err)
	}
	return nil
}

// ValidateSchema checks v against an inline schema (raw JSON), resolving $refs in this spec.
func (s *Spec) ValidateSchema(rawSchema json.RawMessage, v any) error {
	var sc schema
	if err := json.Unmarshal(rawSchema, &sc); err != nil {
		return fmt.Errorf("openapi: schema: %w", err)
	}
	return s.validate(&sc, v, "$")
}

func jsonType(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case string:
		return "string"
	case float64:
		if x == math.Trunc(x) {
			return "integer"
		}
		return "number"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return fmt.Sprintf("%T", v)
}

func (s *Spec) validate(sc *schema, v any, at string) error {
	if sc.Ref != "" {
		name, ok := strings.CutPrefix(sc.Ref, "#/components/schemas/")
		ref, found := s.doc.Components.Schemas[name]
		if !ok || !found {
			return fmt.Errorf("%s: unresolvable $ref %q", at, sc.Ref)
		}
		return s.validate(ref, v, at)
	}
	if err := checkType(sc, v, at); err != nil {
		return err
	}
	if len(sc.Enum) > 0 && !slices.ContainsFunc(sc.Enum, func(e any) bool { return fmt.Sprint(e) == fmt.Sprint(v) && jsonType(e) == jsonType(v) }) {
		return fmt.Errorf("%s: %v is not one of %v", at, v, sc.Enum)
	}
	switch x := v.(type) {
	case string:
		return checkString(sc, x, at)
	case float64:
		if sc.Minimum != nil && x < *sc.Minimum || sc.Maximum != nil && x > *sc.Maximum {
			return fmt.Errorf("%s: %v out of bounds", at, x)
		}
	case []any:
		if sc.MinItems != nil && len(x) < *sc.MinItems || sc.MaxItems != nil && len(x) > *sc.MaxItems {
			return fmt.Errorf("%s: %d items out of bounds", at, len(x))
		}
		if sc.Items != nil {
			for i, e := range x {
				if err := s.validate(sc.Items, e, fmt.Sprintf("%s[%d]", at, i)); err != nil {
					return err
				}
			}
		}
	case map[string]any:
		return s.validateObject(sc, x, at)
	}
	return nil
}

// checkType checks v's JSON type against the schema's type or types, an integer passing as a
// number.
func checkType(sc *schema, v any, at string) error {
	if sc.Type == nil {
		return nil
	}
	var types []string
	switch t := sc.Type.(type) {
	case string:
		types = []string{t}
	case []any:
		for _, x := range t {
			types = append(types, fmt.Sprint(x))
		}
	}
	got := jsonType(v)
	if !slices.Contains(types, got) && !(got == "integer" && slices.Contains(types, "number")) {
		return fmt.Errorf("%s: %s, want %v", at, got, types)
	}
	return nil
}

// checkString checks a string's length in runes, its pattern and its date-time format.
func checkString(sc *schema, x, at string) error {
	n := utf8.RuneCountInString(x)
	if sc.MinLength != nil && n < *sc.MinLength || sc.MaxLength != nil && n > *sc.MaxLength {
		return fmt.Errorf("%s: length %d out of bounds", at, n)
	}
	if sc.Pattern != "" {
		re, err := regexp.Compile(sc.Pattern)
		if err != nil {
			return fmt.Errorf("%s: bad pattern %q: %w", at, sc.Pattern, err)
		}
		if !re.MatchString(x) {
			return fmt.Errorf("%s: %q does not match %s", at, x, sc.Pattern)
		}
	}
	if sc.Format == "date-time" {
		if _, err := time.Parse(time.RFC3339Nano, x); err != nil {
			return fmt.Errorf("%s: %q is not a date-time", at, x)
		}
	}
	return nil
}

// validateObject checks an object's required properties, then each property in key order
// against its own schema or additionalProperties, so that the first error found is the same
// every run.
func (s *Spec) validateObject(sc *schema, x map[string]any, at string) error {
	for _, r := range sc.Required {
		if _, ok := x[r]; !ok {
			return fmt.Errorf("%s: required property %q is missing", at, r)
		}
	}
	keys := make([]string, 0, len(x))
	for k := range x {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if p, ok := sc.Properties[k]; ok {
			if err := s.validate(p, x[k], at+"."+k); err != nil {
				return err
			}
			continue
		}
		switch ap := sc.AdditionalProperties.(type) {
		case bool:
			if !ap {
				return fmt.Errorf("%s: unexpected property %q", at, k)
			}
		case map[string]any:
			raw, _ := json.Marshal(ap)
			var sub schema
			if err := json.Unmarshal(raw, &sub); err != nil {
				return fmt.Errorf("%s: additionalProperties: %w", at, err)
			}
			if err := s.validate(&sub, x[k], at+"."+k); err != nil {
				return err
			}
		}
	}
	return nil
}
