package api_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers/legacy"
	"github.com/gin-gonic/gin"

	"seckill/api"
)

// served fetches the document the way a client does, through Serve.
func served(t *testing.T) []byte {
	t.Helper()
	gin.SetMode(gin.TestMode)
	r := gin.New()
	r.GET("/openapi.yaml", api.Serve)
	rec := httptest.NewRecorder()
	r.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/openapi.yaml", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /openapi.yaml: %d", rec.Code)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/yaml" {
		t.Errorf("GET /openapi.yaml: Content-Type %q, want application/yaml", ct)
	}
	return rec.Body.Bytes()
}

// load parses and validates the served document as OpenAPI.
func load(t *testing.T) *openapi3.T {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromData(served(t))
	if err != nil {
		t.Fatalf("parse openapi.yaml: %v", err)
	}
	return doc
}

// TestDocumentIsOpenAPI31 checks that what the server serves is the file
// in the repository, that it declares OpenAPI 3.1, and that kin-openapi
// finds it valid: its references resolve, its schemas are schemas, and
// its examples match them.
func TestDocumentIsOpenAPI31(t *testing.T) {
	onDisk, err := os.ReadFile("openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(served(t), onDisk) {
		t.Error("GET /openapi.yaml does not answer openapi.yaml")
	}
	doc := load(t)
	if !strings.HasPrefix(doc.OpenAPI, "3.1.") || !doc.IsOpenAPI31OrLater() || doc.IsOpenAPI32OrLater() {
		t.Errorf("openapi: %q, want 3.1.x", doc.OpenAPI)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("openapi.yaml is not valid OpenAPI 3.1: %v", err)
	}
}

// TestServedAsDocumented checks GET /openapi.yaml's own answer against
// the document, as cmd/server's tests check every other route's.
func TestServedAsDocumented(t *testing.T) {
	doc := load(t)
	router, err := legacy.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	gin.SetMode(gin.TestMode)
	r := gin.New()
	r.GET("/openapi.yaml", api.Serve)
	// Absolute, as a client sends it: the document's server is
	// "{scheme}://{host}", which kin-openapi's router matches the URL to.
	req := httptest.NewRequest(http.MethodGet, "http://127.0.0.1:8080/openapi.yaml", nil)
	route, params, err := router.FindRoute(req)
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	r.ServeHTTP(rec, req)
	opts := &openapi3filter.Options{IncludeResponseStatus: true}
	err = openapi3filter.ValidateResponse(context.Background(), &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route, Options: opts},
		Status:                 rec.Code,
		Header:                 rec.Header(),
		Body:                   io.NopCloser(rec.Body),
		Options:                opts,
	})
	if err != nil {
		t.Errorf("GET /openapi.yaml does not answer as documented: %v", err)
	}
}

// documented lists "METHOD /path" for every operation of doc.
func documented(doc *openapi3.T) []string {
	var out []string
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			out = append(out, method+" "+path)
		}
	}
	slices.Sort(out)
	return out
}

// TestErrorResponses checks the rules every operation follows: each error
// status answers the one envelope (Error), a 429 always describes its
// Retry-After header, and a route that needs a token documents 401.
func TestErrorResponses(t *testing.T) {
	doc := load(t)
	envelope := doc.Components.Schemas["Error"].Value
	isEnvelope := func(s *openapi3.SchemaRef) bool {
		if s == nil {
			return false
		}
		if s.Value == envelope {
			return true
		}
		for _, part := range s.Value.AllOf {
			if part.Value == envelope {
				return true
			}
		}
		return false
	}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			name := method + " " + path
			for status, resp := range op.Responses.Map() {
				if status < "400" {
					continue
				}
				mt := resp.Value.Content.Get("application/json")
				if mt == nil || !isEnvelope(mt.Schema) {
					t.Errorf("%s: %s does not answer the error envelope", name, status)
				}
				if _, ok := resp.Value.Headers["Retry-After"]; status == "429" && !ok {
					t.Errorf("%s: 429 without a Retry-After header", name)
				}
			}
			needsToken := op.Security != nil && len(*op.Security) > 0
			if needsToken && op.Responses.Status(http.StatusUnauthorized) == nil {
				t.Errorf("%s needs a token but documents no 401", name)
			}
		}
	}
}

// TestProseNamesEveryRoute checks that docs/api.md has a section for each
// documented route, so that the prose cannot fall behind the document.
func TestProseNamesEveryRoute(t *testing.T) {
	prose, err := os.ReadFile("../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	headings := map[string]bool{}
	for line := range strings.Lines(string(prose)) {
		if h, ok := strings.CutPrefix(strings.TrimSpace(line), "### "); ok {
			for _, part := range strings.Split(h, ",") {
				headings[strings.Trim(strings.TrimSpace(part), "`")] = true
			}
		}
	}
	for _, op := range documented(load(t)) {
		if !headings[op] {
			t.Errorf("docs/api.md has no heading naming %s (such as \"### `%s`\")", op, op)
		}
	}
}
