// Starts Swagger UI on the OpenAPI document served next to this page (`{api}/openapi.json`).
// A file of its own, not an inline script, so the page's Content-Security-Policy can forbid
// inline scripts. Swagger UI (Apache-2.0, SmartBear Software): docs/LICENSE.
window.addEventListener("load", function () {
  window.ui = SwaggerUIBundle({
    url: new URL("openapi.json", document.baseURI).href,
    dom_id: "#swagger-ui",
    presets: [SwaggerUIBundle.presets.apis],
    layout: "BaseLayout",
    deepLinking: true,
    // The default badge asks a public validator about the document: nothing leaves this origin.
    validatorUrl: null,
    // The API key stays in this page's memory: never in localStorage.
    persistAuthorization: false,
    // Settings from the URL's query would let a link reconfigure the page.
    queryConfigEnabled: false,
  });
});
