// The isolated worker's start-up: the store and the options the function applies changes with.
using Microsoft.Azure.Functions.Worker.Builder;
using Microsoft.Extensions.DependencyInjection;
using Microsoft.Extensions.Hosting;
using OrdersConsumer;

var builder = FunctionsApplication.CreateBuilder(args);

// In memory so the sample runs as it is; each instance then has its own copy. Replace it with your database
// (samples/README.md: one guarded upsert per change) before relying on it.
builder.Services.AddSingleton<IChangeStore, MemoryChangeStore>();
builder.Services.AddSingleton(ChangeOptions.FromEnvironment());

builder.Build().Run();
