// Package api is the server's OpenAPI 3.1 description, openapi.yaml, built
// into the binary and served at GET /openapi.yaml, so that a client, a
// code generator or a test reads the contract from the server it talks to
// rather than from a copy that may have drifted.
//
// docs/api.md tells the same contract in prose. The tests here check that
// the document is valid OpenAPI 3.1; cmd/server's tests check that it names
// exactly the routes the server serves (cmd/server/routes.go), and real
// answers against it. A route added without a line here fails them.
package api

import (
	_ "embed"
	"net/http"

	"github.com/gin-gonic/gin"
)

//go:embed openapi.yaml
var document []byte

// Serve answers GET /openapi.yaml: the document. application/yaml is its
// registered media type (RFC 9512).
func Serve(c *gin.Context) {
	c.Data(http.StatusOK, "application/yaml", document)
}
